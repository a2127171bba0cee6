"""Read the original WebShop raw files and apply the original's cleaning rules.

The raw product file of the full catalog is about 5 GB: it is read as a stream of JSON objects, one product at a
time, so it never sits in memory as Python objects at once.

Files (docs/webshop-behaviour.md, "Data and cleaning"):
  items_shuffle*.json   JSON array of products
  items_ins_v2*.json    {asin: {"attributes": [...], "instruction": str, "instruction_attributes": [...]}}
  items_human_ins.json  {asin: [{"instruction": str, "instruction_attributes": [...], "instruction_options": [...]}]}
"""

from __future__ import annotations

import bisect
import json
import os
import re
import tempfile
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

DUMMY_ATTR = "DUMMY_ATTR"
DEFAULT_PRICE = 100.0
MAX_ASIN_LENGTH = 10

PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
ATTRIBUTE_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
HUMAN_FILE = "items_human_ins.json"


class RawDataError(ValueError):
    """The raw files are missing or malformed; the message says which file and what to do."""


@dataclass
class Product:
    """One cleaned product, as the original holds it after loading."""

    asin: str
    title: str
    description: str
    bullet_points: list[str]
    price_text: str  # what pages show, e.g. "$24.49 to $39.99"
    pricing: list[float]  # one value, or [low, high] for a range
    options: dict[str, list[str]]  # lower-cased group name -> cleaned values, in data order
    attributes: list[str]
    category: str
    query: str
    product_category: str
    # goals material
    instruction_text: str | None = None  # synthetic instruction (items_ins_v2)
    instruction_attributes: list[str] | None = None
    human_instructions: list[dict[str, Any]] = field(default_factory=list)


def iter_json_array(path: Path, chunk_size: int = 1 << 20) -> Iterator[Any]:
    """Yield the elements of a top-level JSON array one at a time, reading the file in chunks."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as handle:
        buffer = handle.read(chunk_size)
        position = _skip_whitespace(buffer, 0)
        if position >= len(buffer) or buffer[position] != "[":
            raise RawDataError(f"{path}: expected a JSON array of products (file must start with '[')")
        position += 1
        eof = False
        while True:
            position = _skip_separators(buffer, position)
            if position < len(buffer) and buffer[position] == "]":
                return
            try:
                value, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError as error:
                if eof:
                    raise RawDataError(
                        f"{path}: malformed JSON near character {error.pos}: {error.msg}"
                    ) from None
                more = handle.read(chunk_size)
                eof = not more
                buffer = buffer[position:] + more
                position = 0
                continue
            if end == len(buffer) and not eof:
                # A number or literal may continue in the next chunk: re-read with more data.
                more = handle.read(chunk_size)
                if more:
                    buffer = buffer[position:] + more
                    position = 0
                    continue
                eof = True
            yield value
            position = end
            if len(buffer) - position < chunk_size // 2 and not eof:
                more = handle.read(chunk_size)
                eof = not more
                buffer = buffer[position:] + more
                position = 0


def _skip_whitespace(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _skip_separators(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n,":
        position += 1
    return position


def parse_pricing(pricing: Any, asin: str = "?") -> tuple[list[float], str]:
    """Parse a raw ``pricing`` string into (values, shown price text) by the original's rules."""
    if not pricing:
        return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    pieces = str(pricing).split("$")[1:]
    values = []
    for piece in pieces:
        digits = re.sub(r"[^\d.]", "", piece)
        try:
            values.append(float(Decimal(digits)))
        except InvalidOperation:
            raise RawDataError(f"product {asin}: cannot parse price piece {piece!r} of {pricing!r}") from None
    if not values:
        raise RawDataError(f"product {asin}: pricing {pricing!r} has no '$' amount")
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def clean_options(raw_options: Any) -> dict[str, list[str]]:
    """Lower-case group names and values, strip values and turn '/' into ' | ' (the original's rules)."""
    options: dict[str, list[str]] = {}
    if not raw_options or not isinstance(raw_options, dict):
        return options
    for name, contents in raw_options.items():
        if contents is None:
            continue
        options[str(name).lower()] = [
            str(content["value"]).strip().replace("/", " | ").lower() for content in contents
        ]
    return options


def find_raw_file(raw_dir: Path, candidates: tuple[str, ...]) -> Path | None:
    for name in candidates:
        if (raw_dir / name).exists():
            return raw_dir / name
    return None


def load_json_object(path: Path | None) -> dict[str, Any]:
    """A whole JSON object file in memory (small files; ``JsonObjectFile`` streams big ones)."""
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as error:
        raise RawDataError(f"{path}: malformed JSON: {error}") from None
    if not isinstance(data, dict):
        raise RawDataError(f"{path}: expected a JSON object keyed by ASIN")
    return data


def iter_json_object(path: Path, chunk_size: int = 1 << 20) -> Iterator[tuple[str, str]]:
    """Yield (key, value as JSON text) of a top-level JSON object in file order, reading the file in chunks.

    Only one member is decoded at a time. A key that occurs twice is yielded twice (``json.load`` keeps the
    last; ``JsonObjectFile`` does the same).
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as handle:
        buffer = handle.read(chunk_size)
        eof = not buffer
        position = _skip_whitespace(buffer, 0)
        if position >= len(buffer) or buffer[position] != "{":
            raise RawDataError(f"{path}: expected a JSON object keyed by ASIN (file must start with '{{')")
        position += 1
        expect_member = False  # after a comma, another member must follow
        while True:
            if len(buffer) - position < chunk_size // 2 and not eof:
                more = handle.read(chunk_size)
                eof = not more
                buffer, position = buffer[position:] + more, 0
            position = _skip_whitespace(buffer, position)
            if position < len(buffer) and buffer[position] == "}" and not expect_member:
                _expect_end(path, handle, buffer[position + 1 :])
                return
            try:
                key, after_key = decoder.raw_decode(buffer, position)
                colon = _skip_whitespace(buffer, after_key)
                if not isinstance(key, str) or colon >= len(buffer) or buffer[colon] != ":":
                    raise json.JSONDecodeError("expected a string key and ':'", buffer, position)
                start = _skip_whitespace(buffer, colon + 1)
                _, end = decoder.raw_decode(buffer, start)
                separator = _skip_whitespace(buffer, end)
                if not eof and (separator >= len(buffer) or buffer[separator] not in ",}"):
                    # a number cut by the chunk's end ("3." of "3.25") decodes as its prefix: read on
                    raise json.JSONDecodeError(
                        "value or separator may continue in the next chunk", buffer, end
                    )
            except json.JSONDecodeError as error:
                if eof:
                    raise RawDataError(
                        f"{path}: malformed JSON object near character {error.pos}: {error.msg}"
                    ) from None
                more = handle.read(chunk_size * 4)  # a member longer than the buffer: grow it
                eof = not more
                buffer, position = buffer[position:] + more, 0
                continue
            yield key, buffer[start:end]
            if separator < len(buffer) and buffer[separator] == ",":
                position, expect_member = separator + 1, True
            elif separator < len(buffer) and buffer[separator] == "}":
                _expect_end(path, handle, buffer[separator + 1 :])
                return
            else:
                raise RawDataError(f"{path}: malformed JSON object: expected ',' or '}}' after key {key!r}")


def _expect_end(path: Path, handle: Any, rest: str) -> None:
    """Only whitespace may follow the top-level value (as for ``json.load``)."""
    while rest:
        if rest.strip(" \t\r\n"):
            raise RawDataError(f"{path}: malformed JSON: extra data after the top-level object")
        rest = handle.read(1 << 20)


class JsonObjectFile:
    """A big JSON object file keyed by ASIN, read member by member: ``get`` decodes one value on demand.

    ``json.load`` of the full catalog's instruction file holds about 2 GB of Python objects; this keeps only
    the sorted keys (bytes) with each value's (offset, length) in memory, and the values' JSON text in an
    anonymous scratch file. Returns the same values as ``load_json_object(path).get(key)`` (the last of
    duplicate keys wins).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._keys: list[bytes] = []
        self._offsets = array("q")
        self._lengths = array("q")
        self._scratch = tempfile.TemporaryFile(prefix="webshop-raw-")  # noqa: SIM115 (closed by close())
        if path is None:
            return
        keys: list[bytes] = []
        offsets, lengths = array("q"), array("q")
        size = 0
        write = self._scratch.write
        for key, text in iter_json_object(Path(path)):
            data = text.encode("utf-8", "surrogatepass")
            write(data)
            keys.append(key.encode("utf-8", "surrogatepass"))
            offsets.append(size)
            lengths.append(len(data))
            size += len(data)
        self._scratch.flush()
        order = sorted(range(len(keys)), key=keys.__getitem__)  # stable: duplicates stay in file order
        last = len(order) - 1
        for position, index in enumerate(order):
            if position == last or keys[order[position + 1]] != keys[index]:  # the last duplicate wins
                self._keys.append(keys[index])
                self._offsets.append(offsets[index])
                self._lengths.append(lengths[index])

    def _find(self, key: object) -> int:
        if not isinstance(key, str):
            return -1
        wanted = key.encode("utf-8", "surrogatepass")
        position = bisect.bisect_left(self._keys, wanted)
        return position if position < len(self._keys) and self._keys[position] == wanted else -1

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return self._find(key) >= 0

    def get(self, key: str, default: Any = None) -> Any:
        position = self._find(key)
        if position < 0:
            return default
        data = os.pread(self._scratch.fileno(), self._lengths[position], self._offsets[position])
        return json.loads(data.decode("utf-8", "surrogatepass"))

    def close(self) -> None:
        self._scratch.close()

    def __enter__(self) -> JsonObjectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_products(
    raw_dir: Path,
    num_products: int | None = None,
    product_file: Path | None = None,
) -> Iterator[Product]:
    """Yield cleaned products from ``raw_dir`` in file order, skipping bad and duplicate ASINs.

    ``num_products`` slices the raw list before filtering, as the original's ``products[:num_products]`` does.
    """
    raw_dir = Path(raw_dir)
    product_path = product_file or find_raw_file(raw_dir, PRODUCT_FILES)
    if product_path is None or not Path(product_path).exists():
        raise RawDataError(
            f"no product file in {raw_dir} (expected one of {', '.join(PRODUCT_FILES)}); "
            "run `agent-envs catalog generate` or `agent-envs catalog download` first"
        )
    with (
        JsonObjectFile(find_raw_file(raw_dir, ATTRIBUTE_FILES)) as attributes,
        JsonObjectFile(find_raw_file(raw_dir, (HUMAN_FILE,))) as human,
    ):
        seen: set[str] = set()
        for index, raw in enumerate(iter_json_array(Path(product_path))):
            if num_products is not None and index >= num_products:
                break
            product = clean_product(raw, attributes, human, seen)
            if product is not None:
                yield product


def clean_product(
    raw: dict[str, Any],
    attributes: dict[str, Any] | JsonObjectFile,
    human: dict[str, Any] | JsonObjectFile,
    seen: set[str],
) -> Product | None:
    """Apply the original's cleaning to one raw record; None when the record is skipped."""
    asin = raw.get("asin")
    if not isinstance(asin, str) or asin == "nan" or len(asin) > MAX_ASIN_LENGTH or asin in seen:
        return None
    seen.add(asin)
    bullets = raw.get("small_description")
    if isinstance(bullets, list):
        bullet_points = [str(b) for b in bullets]
    else:
        bullet_points = [bullets if isinstance(bullets, str) else ""]
    pricing, price_text = parse_pricing(raw.get("pricing"), asin)
    entry = attributes.get(asin)
    if not isinstance(entry, dict):
        entry = {}
    product_attributes = list(entry["attributes"]) if "attributes" in entry else [DUMMY_ATTR]
    return Product(
        asin=asin,
        title=str(raw.get("name") or ""),
        description=str(raw.get("full_description") or ""),
        bullet_points=bullet_points,
        price_text=price_text,
        pricing=pricing,
        options=clean_options(raw.get("customization_options")),
        attributes=product_attributes,
        category=str(raw.get("category") or ""),
        query=str(raw.get("query") or "").lower().strip(),
        product_category=str(raw.get("product_category") or ""),
        instruction_text=entry.get("instruction"),
        instruction_attributes=entry.get("instruction_attributes"),
        human_instructions=list(human.get(asin) or []),
    )


def index_text(product: Product) -> str:
    """The text the original's Lucene index holds for a product (title, description, first bullet, options)."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.options.items())
    first_bullet = product.bullet_points[0] if product.bullet_points else ""
    return " ".join([product.title, product.description, first_bullet, option_text]).lower()
