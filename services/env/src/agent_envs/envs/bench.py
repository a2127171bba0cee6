"""``agent-envs bench-envs``: steps/s and latency per environment, in process and through the balancer.

For each environment: expert episodes (the environment's own ``expert``) on a fixed task sample,

- **in process**: ``reset`` and ``step`` of the core, one call at a time (the simulator's own cost);
- **native over HTTP**: ``/<env>/v1/reset`` + ``/<env>/v1/step`` through the balancer (nginx + replicas; a local
  cluster this command starts, or ``--url``), ``--concurrency`` episodes in flight;
- **AgentGym over HTTP**: the same episodes with AgentGym's client requests (``/create``, ``/reset``,
  ``/step``, ``/close``) against our routes (beside AgentGym's own servers: ``bench_agentgym``, which
  ``--agentgym ENV=URL`` runs instead of this table);
- **SciWorld's reset**: from the warm pool (a started JVM waiting: load + look) against a cold JVM (start + load +
  look: what AgentGym's ``/create`` + ``/reset`` cost), in process.

Every row carries the 1-minute load average when it was measured. Prints a table (and JSON with ``--json``).
Figures depend on the machine and on what else runs on it; no test asserts on them. WebShop has its own
benchmarks (``agent-envs bench``, ``make bench``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import httpx

from . import registry
from .expert_bench import quantile_ms


def _percentiles(samples: Sequence[float]) -> dict[str, float]:
    if not samples:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    return {"p50_ms": round(quantile_ms(samples, 0.5), 3), "p99_ms": round(quantile_ms(samples, 0.99), 3)}


def default_envs() -> str:
    """The environments this deployment serves (``AGENTRL_ENVS``) that the contract's routes serve (WebShop, with
    a protocol of its own, is benchmarked by ``agent-envs bench`` and ``bench-http``), else TextCraft and BabyAI."""
    enabled = [e.strip() for e in os.environ.get("AGENTRL_ENVS", "").split(",") if e.strip()]
    chosen = [e for e in enabled if e in registry.contract_ids()]
    return ",".join(chosen) or "textcraft,babyai"


def load() -> float:
    """The 1-minute load average (what else the machine was doing while a row was measured)."""
    return round(os.getloadavg()[0], 2)


def bench_sciworld_resets(resets: int) -> list[dict[str, Any]]:
    """SciWorld's reset from the warm pool against a cold JVM start, in process (``sciworld.bench``)."""
    from .sciworld import JvmPool, SciWorldEnv
    from .sciworld.bench import cold_resets, warm_resets

    cold, _ = cold_resets(resets)
    env = SciWorldEnv(JvmPool(spares=1, max_live=2, wait_s=300))
    try:
        warm = warm_resets(env, resets)
    finally:
        env.shutdown()
    none = {"p50_ms": "-", "p99_ms": "-"}
    return [
        {"path": "reset, warm pool (in process)", "episodes": resets, "steps": 0, "steps_per_s": "-",
         "reset": _percentiles(warm), "step": none},
        {"path": "reset, cold JVM: AgentGym's /create + /reset (in process)", "episodes": resets, "steps": 0,
         "steps_per_s": "-", "reset": _percentiles(cold), "step": none},
    ]  # fmt: skip


def plans(env_id: str, episodes: int, max_steps: int = 30) -> list[tuple[int, list[str]]]:
    """``episodes`` (task, expert actions) pairs spread over the task list (tasks without an expert skipped)."""
    env = registry.make(env_id)
    count = env.task_count()
    stride = max(1, count // max(1, episodes * 2))
    found: list[tuple[int, list[str]]] = []
    for task in range(0, count, stride):
        actions = env.expert(task)
        if actions:
            found.append((task, list(actions)[:max_steps]))
        if len(found) == episodes:
            break
    return found


def bench_in_process(env_id: str, episode_plans: list[tuple[int, list[str]]]) -> dict[str, Any]:
    env = registry.make(env_id)
    resets, steps = [], []
    started = time.perf_counter()
    for task, actions in episode_plans:
        t = time.perf_counter()
        result = env.reset(task)
        resets.append(time.perf_counter() - t)
        for action in actions:
            t = time.perf_counter()
            result = env.step(result.state, action)
            steps.append(time.perf_counter() - t)
            if result.done:
                break
        closer = getattr(env, "close", None)
        if callable(closer):
            closer(result.state)
    elapsed = time.perf_counter() - started
    return {"path": "in process", "episodes": len(episode_plans), "steps": len(steps),
            "steps_per_s": round(len(steps) / elapsed, 1), "reset": _percentiles(resets),
            "step": _percentiles(steps)}  # fmt: skip


async def _drive(episode_plans, concurrency: int, run_one) -> dict[str, Any]:
    resets: list[float] = []
    steps: list[float] = []
    errors = 0
    semaphore = asyncio.Semaphore(concurrency)

    async def one(task: int, actions: list[str]) -> None:
        nonlocal errors
        async with semaphore:
            try:
                await run_one(task, actions, resets, steps)
            except Exception:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(task, actions) for task, actions in episode_plans))
    elapsed = time.perf_counter() - started
    return {"episodes": len(episode_plans), "steps": len(steps), "errors": errors,
            "steps_per_s": round(len(steps) / elapsed, 1), "reset": _percentiles(resets),
            "step": _percentiles(steps)}  # fmt: skip


async def bench_native(url: str, env_id: str, episode_plans, concurrency: int) -> dict[str, Any]:
    from ..client import EnvClient

    async with EnvClient(url, env_id, timeout=120, retries=3) as client:

        async def run_one(task, actions, resets, steps) -> None:
            t = time.perf_counter()
            result = await client.reset(task)
            resets.append(time.perf_counter() - t)
            for action in actions:
                t = time.perf_counter()
                result = await client.step(result["state"], action)
                steps.append(time.perf_counter() - t)
                if result["done"]:
                    break
            if callable(getattr(registry.make(env_id), "close", None)):  # free a held simulator (SciWorld)
                await client.close(result["state"])

        return {"path": "native over HTTP", **await _drive(episode_plans, concurrency, run_one)}


CREATE_BODY = {"textcraft": {"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None}}


async def bench_agentgym(
    base: str, env_id: str, episode_plans, concurrency: int, label: str
) -> dict[str, Any]:
    """AgentGym's client requests, as its ``<Env>EnvClient`` sends them (JSON bodies, one /create per episode)."""
    async with httpx.AsyncClient(base_url=base.rstrip("/"), timeout=120,
                                 limits=httpx.Limits(max_connections=concurrency)) as http:  # fmt: skip

        async def post(path: str, body: dict | None) -> Any:
            response = await (http.post(path, json=body) if body is not None else http.post(path))
            response.raise_for_status()
            data = response.json()
            if isinstance(data, dict) and "error" in data and "observation" not in data:
                raise RuntimeError(data["error"])
            return data

        async def run_one(task, actions, resets, steps) -> None:
            t = (
                time.perf_counter()
            )  # a reset is /create + /reset (AgentGym's SciWorld server starts a JVM in /create)
            created = await post("/create", CREATE_BODY.get(env_id))
            env_idx = created["id"] if isinstance(created, dict) else created
            await post("/reset", {"data_idx": task, "id": env_idx})
            resets.append(time.perf_counter() - t)
            for action in actions:
                t = time.perf_counter()
                result = await post("/step", {"action": action, "id": env_idx})
                steps.append(time.perf_counter() - t)
                if result.get("done"):
                    break
            await post("/close", {"id": env_idx})

        return {"path": label, **await _drive(episode_plans, concurrency, run_one)}


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| env | path | episodes | steps | errors | steps/s | reset p50 / p99 ms | step p50 / p99 ms | load |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in rows:
        lines.append(
            f"| {row['env']} | {row['path']} | {row['episodes']} | {row['steps']} | {row.get('errors', 0)} | "
            f"{row['steps_per_s']} | {row['reset']['p50_ms']} / {row['reset']['p99_ms']} | "
            f"{row['step']['p50_ms']} / {row['step']['p99_ms']} | {row.get('load', '')} |"
        )
    lines.append(f"\n{os.cpu_count()} CPUs; load: the 1-minute load average when the row was measured")
    return "\n".join(lines)


def run(env_ids: Sequence[str], episodes: int, concurrency: int, url: str | None,
        replicas: int = 2) -> list[dict[str, Any]]:  # fmt: skip
    """Every measurement for every environment; starts (and stops) a local cluster when ``url`` is None."""
    import tempfile
    from pathlib import Path

    rows: list[dict[str, Any]] = []
    episode_plans = {env_id: plans(env_id, episodes) for env_id in env_ids}
    for env_id in env_ids:
        rows.append({"env": env_id, **bench_in_process(env_id, episode_plans[env_id]), "load": load()})
    if "sciworld" in env_ids:
        rows += [
            {"env": "sciworld", **row, "load": load()} for row in bench_sciworld_resets(max(4, episodes // 2))
        ]
    cluster_dir = None
    if url is None:
        from .. import cluster

        cluster_dir = Path(tempfile.mkdtemp(prefix="bench-envs-"))
        record = cluster.up(replicas=replicas, catalog=Path("data/catalog"), base_port=0, port=0, workers=1,
                            run_dir=cluster_dir, env={"AGENTRL_ENVS": ",".join(env_ids),
                                                      "AGENTRL_ALLOW_EPHEMERAL_SECRET": "1"},
                            timeout=180, quiet=True)  # fmt: skip
        url = record["url"]
    try:
        for env_id in env_ids:
            native = asyncio.run(bench_native(url, env_id, episode_plans[env_id], concurrency))
            rows.append({"env": env_id, **native, "load": load()})
            ours = asyncio.run(bench_agentgym(f"{url}/{env_id}", env_id, episode_plans[env_id], concurrency,
                                              "AgentGym routes over HTTP (ours)"))  # fmt: skip
            rows.append({"env": env_id, **ours, "load": load()})
    finally:
        if cluster_dir is not None:
            from .. import cluster

            cluster.down(cluster_dir, quiet=True)
    return rows
