"""The synthetic catalog generator: deterministic, in the original raw format, and full of the hard cases."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agent_envs.envs.webshop.catalog.generate import (
    ATTRIBUTE_FILE,
    CATEGORIES,
    HUMAN_FILE,
    PRODUCT_FILE,
    generate_catalog,
)
from agent_envs.envs.webshop.catalog.raw import (
    DUMMY_ATTR,
    MAX_ASIN_LENGTH,
    Product,
    iter_json_array,
    iter_products,
)

FILES = (PRODUCT_FILE, ATTRIBUTE_FILE, HUMAN_FILE)


@pytest.fixture(scope="module", params=[150, 1500], ids=lambda size: f"{size}-products")
def catalog(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Every hard case is forced into the first 150 records; 1500 records show them at their natural rates."""
    out = tmp_path_factory.mktemp("catalog")
    return out, generate_catalog(out, request.param, seed=7, progress=False)


@pytest.fixture(scope="module")
def raw_records(catalog: tuple[Path, dict]) -> list[dict]:
    return list(iter_json_array(catalog[0] / PRODUCT_FILE))


@pytest.fixture(scope="module")
def products(catalog: tuple[Path, dict]) -> list[Product]:
    return list(iter_products(catalog[0]))


def raw_values(records: list[dict]) -> list[str]:
    """Every option value as written in the raw records (before cleaning)."""
    return [
        content["value"]
        for record in records
        for contents in (record["customization_options"] or {}).values()
        for content in contents or []
    ]


def read_bytes(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in FILES}


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path: Path) -> None:
    first = read_bytes(Path(generate_catalog(tmp_path / "a", 300, seed=3, progress=False)["out_dir"]))
    second = read_bytes(Path(generate_catalog(tmp_path / "b", 300, seed=3, progress=False)["out_dir"]))
    other = read_bytes(Path(generate_catalog(tmp_path / "c", 300, seed=4, progress=False)["out_dir"]))
    assert first == second
    for name in FILES:
        assert first[name] != other[name], name


def test_smaller_catalog_is_a_prefix_of_a_larger_one(tmp_path: Path) -> None:
    generate_catalog(tmp_path / "small", 250, seed=1, progress=False)
    generate_catalog(tmp_path / "large", 4500, seed=1, progress=False)  # crosses a write batch
    small = list(iter_json_array(tmp_path / "small" / PRODUCT_FILE))
    large = list(iter_json_array(tmp_path / "large" / PRODUCT_FILE))
    assert len(small) == 250 and len(large) == 4500
    assert large[:250] == small


def test_summary_and_files(catalog: tuple[Path, dict], raw_records: list[dict]) -> None:
    out, summary = catalog
    size = summary["products"]
    assert size == len(raw_records)
    assert summary["seed"] == 7
    for name in FILES:
        assert summary["files"][name] == (out / name).stat().st_size > 2
        json.loads((out / name).read_bytes())  # each file is one well-formed JSON document
    assert not list(out.glob(".*.tmp"))
    assert summary["valid_products"] + summary["duplicate_records"] + summary["invalid_asin_records"] == size


def test_raw_records_have_the_original_keys_and_shapes(raw_records: list[dict]) -> None:
    keys = {
        "asin", "name", "full_description", "small_description", "pricing", "customization_options",
        "images", "category", "query", "product_category", "average_rating",
    }  # fmt: skip
    for record in raw_records:
        assert set(record) == keys
        assert record["category"] in CATEGORIES
        assert record["images"] and all(
            url.startswith("https://example.invalid/") for url in record["images"]
        )
        assert isinstance(record["average_rating"], float)
        assert " › " in record["product_category"]
        assert record["query"] == record["query"].lower().strip()
        options = record["customization_options"]
        assert options is None or isinstance(options, dict)
        for contents in (options or {}).values():
            for content in contents or []:
                assert set(content) == {"value", "image"}
    valid = [r["asin"] for r in raw_records if r["asin"] != "nan" and len(r["asin"]) <= MAX_ASIN_LENGTH]
    assert all(len(a) == 10 and a.startswith("B0") and a.isalnum() and a.upper() == a for a in valid)


def test_loader_skips_duplicates_and_invalid_asins(
    catalog: tuple[Path, dict], raw_records: list[dict], products: list[Product]
) -> None:
    asins = [r["asin"] for r in raw_records]
    assert "nan" in asins
    assert any(len(a) > MAX_ASIN_LENGTH for a in asins)
    assert len(asins) - len(set(asins)) >= 2  # duplicates (and repeated "nan")
    assert len(products) < len(raw_records)
    assert len(products) == catalog[1]["valid_products"]
    assert len({p.asin for p in products}) == len(products)


def test_hard_cases_survive_cleaning(raw_records: list[dict], products: list[Product]) -> None:
    values = [v for p in products for vs in p.options.values() for v in vs]
    assert "black | white" in values
    assert {"navy blue", "dark grey"} <= set(values)
    assert any("/" in value for value in raw_values(raw_records))
    # repeated across groups within one product
    assert any(
        len({v for vs in p.options.values() for v in vs}) < sum(len(vs) for vs in p.options.values())
        for p in products
    )
    assert any(
        "small" in p.options.get("size", []) and "small" in p.options.get("style", []) for p in products
    )
    # products without options, both spellings, and a null option group
    assert any(r["customization_options"] == {} for r in raw_records)
    assert any(r["customization_options"] is None for r in raw_records)
    assert any(None in (r["customization_options"] or {}).values() for r in raw_records)
    assert any(not p.options for p in products)
    # raw values in mixed case / padded come out lower-case and stripped
    assert any(value != value.strip() for value in raw_values(raw_records))
    assert any(value != value.lower() for value in raw_values(raw_records))
    assert all(v == v.strip().lower() for v in values)
    # bullets: empty, whitespace-only, and a plain string
    bullets = [b for p in products for b in p.bullet_points]
    assert "" in bullets
    assert any(b and not b.strip() for b in bullets)
    assert any(isinstance(r["small_description"], str) for r in raw_records)
    # prices: ranges, no ceiling, thousands comma, empty
    assert any(len(p.pricing) == 2 and p.pricing[0] < p.pricing[1] for p in products)
    assert any(" to $" in p.price_text for p in products)
    assert any(p.pricing[0] >= 980 for p in products)
    assert any("," in r["pricing"] for r in raw_records)
    assert any(r["pricing"] == "" for r in raw_records)
    assert any(p.price_text == "$100.0" for p in products)
    # quotes in values, empty descriptions
    assert any('"' in v for v in values)
    assert any(p.description == "" for p in products)


def test_synthetic_instructions(catalog: tuple[Path, dict], products: list[Product]) -> None:
    entries = json.loads((catalog[0] / ATTRIBUTE_FILE).read_bytes())
    with_instruction = [e for e in entries.values() if "instruction" in e]
    assert len(with_instruction) > 0.6 * len(entries)
    assert any("instruction" not in e and "attributes" in e for e in entries.values())
    assert any(e == {} for e in entries.values())
    for entry in with_instruction:
        text = entry["instruction"]
        assert entry["instruction_attributes"]
        assert set(entry["instruction_attributes"]) <= set(entry["attributes"])
        assert text == text.lower().strip() and not text.endswith(".")
        assert text.startswith(("i need", "i am looking for", "i want"))
        for attribute in entry["instruction_attributes"]:
            assert attribute in text
    by_asin = {p.asin: p for p in products}
    assert set(entries) == set(by_asin)
    assert any(p.attributes == [DUMMY_ATTR] for p in products)
    assert sum(p.instruction_text is not None for p in products) == len(with_instruction)


def test_human_instructions_name_real_options(catalog: tuple[Path, dict], products: list[Product]) -> None:
    human = json.loads((catalog[0] / HUMAN_FILE).read_bytes())
    by_asin = {p.asin: p for p in products}
    assert human and set(human) <= set(by_asin)
    instructions = [(asin, i) for asin, items in human.items() for i in items]
    assert any(not i["instruction_attributes"] for _, i in instructions)  # the original skips these
    assert any(i["instruction"].endswith(".") for _, i in instructions)
    assert any(i["instruction_options"] for _, i in instructions)
    assert any(" | " in o for _, i in instructions for o in i["instruction_options"])
    for asin, instruction in instructions:
        product = by_asin[asin]
        assert instruction["asin"] == asin
        assert instruction["assignment_id"] and instruction["worker_id"]
        values = {v for vs in product.options.values() for v in vs}
        assert set(instruction["instruction_options"]) <= values, (asin, instruction, product.options)
        assert set(instruction["instruction_attributes"]) <= set(product.attributes)
    assert sum(len(p.human_instructions) for p in products) == len(instructions)


def test_empty_and_tiny_catalogs(tmp_path: Path) -> None:
    summary = generate_catalog(tmp_path / "empty", 0, progress=False)
    assert summary["products"] == 0
    assert json.loads((tmp_path / "empty" / PRODUCT_FILE).read_bytes()) == []
    assert json.loads((tmp_path / "empty" / ATTRIBUTE_FILE).read_bytes()) == {}
    generate_catalog(tmp_path / "one", 1, progress=False)
    assert len(list(iter_products(tmp_path / "one"))) == 1
    with pytest.raises(ValueError, match="products"):
        generate_catalog(tmp_path / "bad", -1, progress=False)


def test_hard_cases_also_occur_at_random_after_the_showcase_records(tmp_path: Path) -> None:
    generate_catalog(tmp_path, 6000, seed=11, progress=False)
    records = list(iter_json_array(tmp_path / PRODUCT_FILE))
    later = records[200:]
    asins = [r["asin"] for r in records]
    counts = Counter(asins)
    assert any(counts[a] > 1 and a != "nan" for a in asins[200:])
    assert any(r["asin"] == "nan" for r in later)
    assert any(len(r["asin"]) > MAX_ASIN_LENGTH for r in later)
    assert any(r["customization_options"] == {} for r in later)
    assert any(r["customization_options"] is None for r in later)
    assert any(" - $" in r["pricing"] for r in later)
    assert any("," in r["pricing"] for r in later)
    assert any(isinstance(r["small_description"], list) and "" in r["small_description"] for r in later)
    assert any("/" in value for value in raw_values(later))
