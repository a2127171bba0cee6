"""``agent-train eval`` end to end through the real cluster (2 replicas + nginx): expert, random, resume,
the turn limit, and the CLI."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest
from _eval_support import SAMPLES

from agent_trainer.eval_cli import EXIT_ERROR, EXIT_OK, main
from agent_trainer.evaluation.runner import EvalConfig, EvalError, PolicySpec, evaluate

pytestmark = pytest.mark.cluster

METRIC_KEYS = {
    "score",
    "success_rate",
    "episodes",
    "mean_steps",
    "invalid_action_rate",
    "by_category",
    "score_ci95",
    "success_rate_ci95",
    "seeds",
    "config",
    "policy",
    "complete",
    "truncated_rate",
    "reward_histogram",
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_expert_solves_the_bundled_catalog(expert_run: Any) -> None:
    m = expert_run.metrics
    assert set(m) >= METRIC_KEYS
    assert m["complete"] and m["episodes"] == SAMPLES and m["failed_episodes"] == []
    assert m["success_rate"] >= 0.95
    assert m["score"] >= 95
    assert m["invalid_action_rate"] == 0.0
    assert m["policy"] == {"name": "expert", "plan_source": "server"}
    assert m["config"]["split"] == "test" and m["config"]["max_turns"] == 24
    assert m["catalog"]["categories_from"] == "server"  # no --catalog: the reset responses carry them
    assert "unknown" not in m["by_category"]
    on_disk = json.loads(expert_run.metrics_path.read_text())
    assert on_disk["score"] == pytest.approx(m["score"])
    assert expert_run.report_path.exists()


def test_metrics_and_report_record_the_catalogs_reward_definition(expert_run: Any, generated_catalog) -> None:
    """Scores under different reward definitions (heuristic vs spaCy nouns, seeded vs pinned prices) must show it."""
    from agent_envs.envs.webshop.catalog.fidelity import describe_fidelity, fidelity_limits

    fidelity = expert_run.metrics["catalog"]["fidelity"]
    assert fidelity == fidelity_limits(generated_catalog.manifest)
    assert fidelity["noun_extractor"] == generated_catalog.manifest["noun_extractor"]
    assert fidelity["prices"] == generated_catalog.manifest["prices"] and fidelity["exact"] is False
    assert json.loads(expert_run.metrics_path.read_text())["catalog"]["fidelity"] == fidelity
    report = expert_run.report_path.read_text()
    assert "Reward definition" in report and html.escape(describe_fidelity(fidelity)) in report
    assert generated_catalog.manifest["noun_extractor"] in describe_fidelity(fidelity)


def test_trajectories_hold_every_step(expert_run: Any) -> None:
    records = read_jsonl(expert_run.out / "trajectories.jsonl")
    assert sorted(r["goal"] for r in records) == list(range(SAMPLES))
    for record in records:
        assert record["steps"] == len(record["turns"]) > 0
        first = record["turns"][0]
        assert first["observation"].startswith("WebShop [SEP] Instruction:")
        assert record["instruction"] in first["observation"]
        assert first["action"].startswith("search[") and first["output"] == first["action"]
        assert record["turns"][-1]["action"] == "click[buy now]"
        assert record["turns"][-1]["reward"] == record["reward"]
        assert record["ended_by"] == "purchase" and not record["truncated"]
        assert {"observation", "available_actions", "output", "action", "reward", "done", "valid"} <= set(
            first
        )


def test_random_is_near_zero_and_categories_come_from_the_catalog(random_run: Any, generated_catalog) -> None:
    m = random_run.metrics
    assert m["complete"] and m["episodes"] == SAMPLES
    assert m["success_rate"] <= 0.05
    assert m["score"] < 40
    assert m["catalog"]["categories_from"] == "catalog"
    expected = {generated_catalog.goal("synthetic", g).category for g in range(SAMPLES)}
    assert set(m["by_category"]) == expected and "unknown" not in expected
    assert sum(c["episodes"] for c in m["by_category"].values()) == SAMPLES
    records = read_jsonl(random_run.out / "trajectories.jsonl")
    assert all(r["steps"] <= 24 for r in records)  # the default step limit: what training allows
    assert all(t["action"] != "click[search]" for r in records for t in r["turns"])
    truncated = [r for r in records if r["truncated"]]
    assert truncated and all(r["reward"] == 0.0 and r["steps"] == 24 for r in truncated)


def test_random_policy_is_reproducible(random_run: Any, eval_cluster: dict, tmp_path: Path) -> None:
    config = EvalConfig(
        out=tmp_path,
        url=eval_cluster["url"],
        split="test",
        goal_set="synthetic",
        max_samples=12,
        concurrency=3,
        progress=False,
        write_report=False,
    )
    again = evaluate(config, PolicySpec(name="random", seed=0))
    first = {
        r["goal"]: [t["action"] for t in r["turns"]]
        for r in read_jsonl(random_run.out / "trajectories.jsonl")
    }
    second = {
        r["goal"]: [t["action"] for t in r["turns"]] for r in read_jsonl(tmp_path / "trajectories.jsonl")
    }
    assert again.metrics["episodes"] == 12
    assert all(second[g] == first[g] for g in second)


def test_resume_skips_finished_episodes(
    eval_cluster: dict, generated_catalog_dir: Path, tmp_path: Path
) -> None:
    def config(samples: int, **extra: Any) -> EvalConfig:
        return EvalConfig(
            out=tmp_path,
            url=eval_cluster["url"],
            split="test",
            goal_set="synthetic",
            max_samples=samples,
            catalog=generated_catalog_dir,
            progress=False,
            **extra,
        )

    first = evaluate(config(6), PolicySpec(name="expert"))
    assert first.metrics["episodes"] == 6 and first.metrics["resumed_episodes"] == 0
    assert first.metrics["policy"]["plan_source"] == "catalog"
    # an interrupted write leaves half a line: that episode is simply run again
    with open(tmp_path / "trajectories.jsonl", "a") as sink:
        sink.write('{"goal": 6, "goal_set": "synth')
    second = evaluate(config(10), PolicySpec(name="expert"))
    assert second.metrics["resumed_episodes"] == 6
    assert second.metrics["episodes"] == 10 and second.complete
    records = read_jsonl(tmp_path / "trajectories.jsonl")
    assert sorted(r["goal"] for r in records) == list(range(10))

    with pytest.raises(EvalError, match="different configuration"):
        evaluate(config(10), PolicySpec(name="random"))
    third = evaluate(config(4, overwrite=True), PolicySpec(name="random"))
    assert third.metrics["episodes"] == 4 and third.metrics["resumed_episodes"] == 0


def test_turn_limit_truncates_with_reward_zero(eval_cluster: dict, tmp_path: Path) -> None:
    config = EvalConfig(
        out=tmp_path,
        url=eval_cluster["url"],
        split="test",
        goal_set="synthetic",
        max_samples=5,
        max_turns=2,
        progress=False,
        write_report=False,
    )
    m = evaluate(config, PolicySpec(name="expert")).metrics
    assert m["episodes"] == 5 and m["score"] == 0.0 and m["truncated_rate"] == 1.0
    assert m["ended_by"] == {"max_turns": 5} and m["mean_steps"] == 2.0


def test_cli_eval_and_report_rebuild(
    eval_cluster: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "cli"
    code = main(
        [
            "eval",
            "--policy",
            "expert",
            "--url",
            eval_cluster["url"],
            "--split",
            "test",
            "--goal-set",
            "synthetic",
            "--max-samples",
            "5",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert code == EXIT_OK
    assert "expert on test (synthetic goals): score" in printed and str(out / "report.html") in printed
    assert {"metrics.json", "trajectories.jsonl", "report.html", "eval_config.json"} <= {
        p.name for p in out.iterdir()
    }
    (out / "report.html").unlink()
    assert main(["report", "--eval", str(out)]) == EXIT_OK
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_cli_errors_are_clear(eval_cluster: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(
        [
            "eval",
            "--policy",
            "expert",
            "--url",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "a"),
            "--ready-timeout",
            "1",
            "--no-progress",
        ]
    )
    assert code == EXIT_ERROR
    assert "was not ready" in capsys.readouterr().err
    code = main(
        [
            "eval",
            "--policy",
            "expert",
            "--url",
            eval_cluster["url"],
            "--goal-set",
            "nope",
            "--out",
            str(tmp_path / "b"),
            "--no-progress",
        ]
    )
    assert code == EXIT_ERROR
    assert "nope" in capsys.readouterr().err


def test_catalog_must_be_the_served_one(eval_cluster: dict, tmp_path: Path) -> None:
    from agent_envs.envs.webshop.catalog.generate import generate_catalog
    from agent_envs.envs.webshop.catalog.prepare import prepare_catalog

    generate_catalog(tmp_path / "raw", products=40, seed=99, progress=False)
    prepare_catalog(tmp_path / "raw", tmp_path / "other", progress=False)
    config = EvalConfig(
        out=tmp_path / "out",
        url=eval_cluster["url"],
        max_samples=2,
        catalog=tmp_path / "other",
        progress=False,
    )
    with pytest.raises(EvalError, match="is not the catalog the server serves"):
        evaluate(config, PolicySpec(name="expert"))
