"""``agent-envs conformance record|check``: the committed recording checks at 100 %, and the recording path
(the same adapter interface the original is driven through) reproduces itself exactly.

The original WebShop is not available here; ``shim_checkout/`` stands in for a checkout of it, with the
original text environment's public shape over this project's environment (see its README).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_envs.cli.main import main
from agent_envs.envs.webshop.conformance.adapter import AdapterError, LocalAdapter, OriginalAdapter
from agent_envs.envs.webshop.conformance.check import check_traces, compare_step
from agent_envs.envs.webshop.conformance.record import record

FIXTURE = Path(__file__).parents[1] / "fixtures" / "conformance" / "original-seed3"
SHIM = Path(__file__).parent / "shim_checkout"
PIN_FILES = ("goals.json", "product_prices.json", "title_nouns.json")


def test_check_reports_100_percent_on_the_committed_recording(conformance_catalog_dir: Path) -> None:
    summary = check_traces(FIXTURE, conformance_catalog_dir, progress=False)
    assert summary["steps"] == 1647 and summary["purchases"] == 85
    assert summary["equal"] == summary["steps"] and summary["equal_pct"] == 100.0
    assert summary["purchases_equal"] == summary["purchases"] and summary["goals_differ"] == 0
    assert summary["first_differences"] == []


def test_check_command_prepares_the_pinned_catalog_itself(tmp_path: Path, capsys) -> None:
    code = main(
        ["conformance", "check", "--traces", str(FIXTURE), "--quiet", "--summary", str(tmp_path / "s.json")]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1647/1647 steps equal (100.000%)" in out and "85/85 purchases identical" in out
    assert json.loads((tmp_path / "s.json").read_text())["catalog_pins"]["noun_extractor"] == "pinned"


def test_check_shows_the_first_differences_of_a_changed_recording(
    tmp_path: Path, conformance_catalog_dir, capsys
):
    traces = tmp_path / "traces"
    shutil.copytree(FIXTURE, traces)
    path = traces / "human-goals" / "traces.jsonl"
    episodes = [json.loads(line) for line in path.read_text().splitlines()]
    purchase = next(s for e in episodes for s in e["steps"] if "verbose_info" in s)
    purchase["reward"] = round(purchase["reward"] + 0.25, 4)
    purchase["verbose_info"]["r_att"] = -1.0
    reset = episodes[0]["steps"][0]
    reset["observation"] = reset["observation"].replace("dollars", "dollars!", 1)
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes))

    code = main(
        [
            "conformance",
            "check",
            "--traces",
            str(traces),
            "--catalog",
            str(conformance_catalog_dir),
            "--quiet",
            "--json",
        ]
    )
    summary = json.loads(capsys.readouterr().out)
    assert code == 1
    human = summary["goal_sets"]["human"]
    assert human["differ"]["reward"] == 1 and human["differ"]["reward_breakdown"] == 1
    assert human["differ"]["observation"] == 1 and summary["goal_sets"]["synthetic"]["equal_pct"] == 100.0
    first = summary["first_differences"][0]
    assert (first["episode"], first["step"], first["field"]) == (0, 0, "observation")
    assert "dollars!" in first["expected"] and "dollars!" not in first["actual"]


def test_compare_step_tells_price_text_from_other_changes() -> None:
    recorded = {
        "observation": "Page 1 [SEP] B0X [SEP] $12.5 [SEP] lower than 30.00 dollars",
        "available_actions": {},
    }
    assert compare_step(recorded, recorded["observation"], {}, 0.0, False, None) == []
    assert compare_step(
        recorded, "Page 1 [SEP] B0X [SEP] $13.75 [SEP] lower than 40.00 dollars", {}, 0, False, None
    ) == ["price_text_only"]
    assert compare_step(
        recorded, "Page 2 [SEP] B0X [SEP] $12.5 [SEP] lower than 30.00 dollars", {"x": 1}, 0, False, None
    ) == ["observation", "clickables"]


def _read_traces(root: Path) -> dict[str, str]:
    return {d: (root / d / "traces.jsonl").read_text() for d in ("synthetic-goals", "human-goals")}


def test_self_test_record_through_the_adapter_then_check_is_100_percent(
    tmp_path, conformance_catalog_dir
) -> None:
    env = LocalAdapter(conformance_catalog_dir)
    summary = record(env, FIXTURE / "raw", tmp_path / "a", seed=5, progress=False)
    for goal_set in ("synthetic", "human"):
        counts = summary["goal_sets"][goal_set]
        assert all(counts["kinds"][kind] > 0 for kind in ("expert", "wrong", "explore", "random"))
        assert 0 < counts["full_reward"] < counts["purchases"]  # full and partial-credit purchases
    # what record exports for pinning is exactly what the catalog was pinned with (the committed recording)
    for folder in ("synthetic-goals", "human-goals"):
        for name in PIN_FILES:
            assert json.loads((tmp_path / "a" / folder / name).read_text()) == json.loads(
                (FIXTURE / folder / name).read_text()
            ), f"{folder}/{name}"
        assert (tmp_path / "a" / folder / "goals.json").read_bytes() == (
            FIXTURE / folder / "goals.json"
        ).read_bytes()
    actions = [json.loads(line) for line in _read_traces(tmp_path / "a")["synthetic-goals"].splitlines()]
    taken = [s["action"] for e in actions for s in e["steps"][1:]]
    for wanted in (
        "click[next >]",
        "click[< prev]",
        "click[description]",
        "click[features]",
        "click[reviews]",
        "click[back to search]",
        "click[buy now]",
    ):
        assert wanted in taken, wanted
    assert any(a.startswith("Search[") or a in ("click[no such button]", "search[]") for a in taken)
    assert any("Total results: 0" in s["observation"] for e in actions for s in e["steps"][1:])

    check = check_traces(tmp_path / "a", conformance_catalog_dir, progress=False)
    assert check["equal_pct"] == 100.0 and check["purchases_equal"] == check["purchases"] > 0

    record(LocalAdapter(conformance_catalog_dir), FIXTURE / "raw", tmp_path / "b", seed=5, progress=False)
    assert _read_traces(tmp_path / "a") == _read_traces(tmp_path / "b"), "one seed, one episode set"
    record(LocalAdapter(conformance_catalog_dir), FIXTURE / "raw", tmp_path / "c", seed=6, progress=False)
    assert _read_traces(tmp_path / "a") != _read_traces(tmp_path / "c")


def test_record_from_a_checkout_through_the_command_line(
    tmp_path: Path, conformance_catalog_dir: Path
) -> None:
    """`record --original` end to end: import from the checkout, data paths, seeding, breakdowns, nouns."""
    environment = {**os.environ, "WEBSHOP_SHIM_CATALOG": str(conformance_catalog_dir)}
    out = tmp_path / "recorded"
    command = [
        sys.executable,
        "-m",
        "agent_envs.cli.main",
        "conformance",
        "record",
        "--original",
        str(SHIM),
        "--raw",
        str(FIXTURE / "raw"),
        "--out",
        str(out),
        "--episodes",
        "synthetic=24,human=12",
        "--quiet",
    ]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["source"].startswith("original WebShop")
    assert (
        summary["goal_sets"]["synthetic"]["episodes"] == 24
        and summary["goal_sets"]["human"]["episodes"] == 12
    )
    for folder in ("synthetic-goals", "human-goals"):
        for name in PIN_FILES:
            assert json.loads((out / folder / name).read_text()) == json.loads(
                (FIXTURE / folder / name).read_text()
            )
        assert (
            json.loads((out / folder / "meta.json").read_text())["rng"] == "random.seed(1234) before loading"
        )
    assert sorted(p.name for p in (out / "raw").iterdir()) == sorted(
        p.name for p in (FIXTURE / "raw").iterdir()
    )
    check = check_traces(out, conformance_catalog_dir, progress=False)
    assert check["equal_pct"] == 100.0 and check["purchases"] > 0


def test_original_adapter_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="not a WebShop checkout"):
        OriginalAdapter(tmp_path, FIXTURE / "raw")
    checkout = tmp_path / "checkout"
    shutil.copytree(SHIM, checkout)
    shutil.rmtree(checkout / "search_engine")
    with pytest.raises(AdapterError, match="no search index"):
        OriginalAdapter(checkout, FIXTURE / "raw")
    with pytest.raises(AdapterError, match="num_products"):
        OriginalAdapter(checkout, FIXTURE / "raw", num_products=300)


def test_catalog_info_prints_the_fidelity_limits(
    generated_catalog_dir, conformance_catalog_dir, capsys
) -> None:
    assert main(["catalog", "info", "--catalog", str(conformance_catalog_dir)]) == 0
    pinned = json.loads(capsys.readouterr().out)["fidelity"]
    assert pinned["exact"] is True and pinned["limits"] == []
    assert main(["catalog", "info", "--catalog", str(generated_catalog_dir)]) == 0
    seeded = json.loads(capsys.readouterr().out)["fidelity"]
    assert seeded["exact"] is False and seeded["prices"].startswith("seeded")
    text = " ".join(seeded["limits"])
    assert "point prices" in text and "price ceilings" in text and seeded["noun_extractor"] in text


def test_unpinned_title_nouns_change_only_purchase_rewards(tmp_path: Path) -> None:
    """The noun extractor feeds the type reward and nothing else: pages, clickables and goals stay identical."""
    from agent_envs.envs.webshop.conformance.check import prepare_for_traces

    manifest = prepare_for_traces(FIXTURE, tmp_path / "catalog", unpin=frozenset({"nouns"}))
    summary = check_traces(FIXTURE, tmp_path / "catalog", max_differences=1000, progress=False)
    assert summary["goals_differ"] == 0
    for report in summary["goal_sets"].values():
        assert report["differ"]["clickables"] == 0 and report["differ"]["price_text_only"] == 0
    for difference in summary["first_differences"]:
        assert difference["action"] == "click[buy now]", (
            difference
        )  # only purchases (and their done page) differ
    if manifest["noun_extractor"].startswith("spacy"):
        assert summary["equal_pct"] == 100.0  # the original's own tagger: nothing differs
    else:
        assert summary["purchases_equal"] >= 74, summary["purchases_equal"]  # heuristic-v4 (v2: 70 of 85)
