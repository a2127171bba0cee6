"""The README's GPU commands, run for real on CPU: ``make train-test ENV=textcraft,babyai DEVICE=cpu`` and ``make eval
ENV=babyai DEVICE=cpu MODEL_PATH=<its checkpoint>``, through the very compose services and job scripts a GPU run
uses (the trainer and eval containers, built from the trainer Dockerfile as its CPU build), against the stack
``make up`` started: the environments' data rows built in the container, the container's preflight, verl's
trainer (the CPU rollout stand-in, a tiny model, the scale-down, each listed in the run's log), a checkpoint on
the checkpoints volume, then the eval job on that checkpoint with its report. Only the GPU is substituted.

Runs under ``make test-docker`` after the stack tests (test_stack.py), on the same engine and scratch copy.
"""

from __future__ import annotations

import json
import time

import httpx
import pyarrow.parquet as pq
import pytest
from dockerstack import Stack

ENVS = "textcraft,babyai"
SERVED = (
    "babyai,textcraft"  # what make train-test ENV=textcraft,babyai serves on a stack serving them: no other
)
EXPERIMENT = "mixed_grpo_test"  # the config of a mix (configs/mixed_grpo_test.yaml)


def _started(stack: Stack, service: str) -> dict[str, str]:
    """Container id -> when it started, for one service of the stack."""
    return {c: stack.inspect(c)["State"]["StartedAt"] for c in stack.containers(service)}


@pytest.mark.timeout(3600)  # images built cold, verl's trainer and the eval on 2 cores: 10-20 minutes
def test_train_test_then_eval_on_cpu_through_the_compose_jobs(stack: Stack) -> None:
    stack.make("up", f"ENVS={SERVED}")
    before = {service: _started(stack, service) for service in ("envs", "balancer", "sessions")}
    assert all(before.values())

    started = time.monotonic()
    trained = stack.make("train-test", f"ENV={ENVS}", "DEVICE=cpu", timeout=3600)
    stack.measured["train_test_cpu_seconds"] = round(time.monotonic() - started, 1)
    # the job's compose run left the stack as `make up` made it: no replica or balancer was re-created (it used
    # to re-create them serving WebShop only, and /textcraft, /babyai then answered 404)
    assert {service: _started(stack, service) for service in before} == before
    for env_id in ENVS.split(","):
        assert httpx.get(f"{stack.url}/{env_id}/v1/info", timeout=10).status_code == 200
    # nothing else was served for the run (WebShop was, whatever the run trained on)
    assert httpx.get(f"{stack.url}/webshop/v1/info", timeout=10).status_code != 200

    checkpoints = stack.root / "outputs" / "checkpoints" / EXPERIMENT
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "2", trained.stdout[
        -3000:
    ]
    actor = checkpoints / "global_step_2" / "actor"
    assert {p.name for p in actor.glob("model_world_size_2_rank_*.pt")} == {
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"}  # fmt: skip
    run = stack.root / "outputs" / "logs" / EXPERIMENT
    log = (run / "logs" / "train.log").read_text(errors="replace")
    assert "agent-train: CPU run: what differs from the GPU run" in log
    assert "actor_rollout_ref.rollout.name=cpu" in log and "policy: a tiny local" in log
    metrics = [json.loads(line) for line in (run / "metrics" / "metrics.jsonl").read_text().splitlines()]
    logged = {row["step"] for row in metrics}
    assert {1, 2} <= logged
    step = next(row["data"] for row in metrics if row["step"] == 2)
    assert {f"env/{env_id}/trajectories" for env_id in ENVS.split(",")} & set(step), sorted(step)[:40]
    # the rows were built in the container, from the served environments' resets (the image has no TextCraft
    # recipes, no minigrid), and the container's preflight checked the config and rolled out
    summary = json.loads((run / "data" / "rows.json").read_text())["summary"]
    assert summary["sources"] == dict.fromkeys(ENVS.split(","), "http://balancer:8080")
    rows = pq.read_table(run / "data" / "train.parquet").to_pylist()
    assert {row["data_source"] for row in rows} == set(ENVS.split(","))
    preflights = [json.loads(p.read_text()) for p in (run / "preflight").rglob("summary.json")]
    assert preflights and all(p["ok"] for p in preflights)
    # ... through the served environments (a service without WebShop was not reused: the container started a
    # cluster of its own)
    assert all(p["cluster"] == {"url": "http://balancer:8080", "reused": True} for p in preflights), (
        preflights
    )

    started = time.monotonic()
    stack.make("eval", "ENV=babyai", "DEVICE=cpu", f"MODEL_PATH=/outputs/checkpoints/{EXPERIMENT}", "MAX_SAMPLES=4",
               timeout=1800)  # fmt: skip
    stack.measured["eval_cpu_seconds"] = round(time.monotonic() - started, 1)
    out = stack.root / "outputs" / "logs" / "eval" / f"{EXPERIMENT}-global_step_2-babyai-test"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == 4 and metrics["complete"], metrics
    assert (out / "report.html").is_file()
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert {r["env"] for r in records} == {"babyai"} and len(records) == 4
    assert (checkpoints / "global_step_2" / "actor" / "huggingface_merged").is_dir() or any(
        checkpoints.rglob("huggingface_merged")
    )
