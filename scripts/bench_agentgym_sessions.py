"""What durable AgentGym sessions cost per step: the same AgentGym load against the same local cluster topology
(2 replicas behind nginx) with the session store's Redis in each persistence mode, alternating rounds so that a
shared machine's noise falls on every mode alike. Prints figures as JSON; asserts nothing.

    .venv/bin/python scripts/bench_agentgym_sessions.py --catalog data/catalog
    .venv/bin/python scripts/bench_agentgym_sessions.py --catalog data/catalog --modes none,everysec,always

Modes: ``none`` (no persistence: the store before issue 22), ``everysec`` (append-only file written before
Redis answers, fsynced once a second: a crash of the machine loses up to a second of acknowledged steps, a crash
of the store loses none; what ``make up-local`` and compose run by default), ``always`` (fsynced before Redis
answers: ``SESSIONS_APPENDFSYNC=always``). Each client plays the expert's episodes (``/create`` once, then ``/reset``
and ``/step`` after ``/step``); a step's latency is the client's, through nginx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agent_envs import cluster
from agent_envs.bench import percentile

MODES = {
    "none": ("--save", "", "--appendonly", "no"),
    "everysec": cluster.redis_persistence({"SESSIONS_APPENDFSYNC": "everysec"}),
    "always": cluster.redis_persistence({"SESSIONS_APPENDFSYNC": "always"}),
}


def start_redis(mode: str, run_dir: Path) -> tuple[subprocess.Popen, str]:
    """A redis-server in ``mode`` with its data in ``run_dir``; (process, URL)."""
    (run_dir / "redis").mkdir(parents=True)
    (port,) = cluster.free_ports(1)
    command = [cluster.redis_binary(), "--bind", "127.0.0.1", "--port", str(port), *MODES[mode],
               "--dir", str(run_dir / "redis"), "--daemonize", "no"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not cluster.redis_ping("127.0.0.1", port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis-server ({mode}) did not start")
        time.sleep(0.05)
    return process, f"redis://127.0.0.1:{port}/0"


async def load(url: str, plans: dict[int, list[str]], clients: int, steps: int) -> dict[str, Any]:
    """``clients`` AgentGym clients stepping expert episodes until ``steps`` steps in all; steps/s, latencies."""
    latencies: list[float] = []
    goals = list(plans)

    async def client(index: int, http: httpx.AsyncClient) -> None:
        env_idx = (await http.post("/create")).json()
        episode = index
        while len(latencies) < steps:
            goal = goals[episode % len(goals)]
            (await http.post("/reset", json={"env_idx": env_idx, "session_id": goal})).raise_for_status()
            for action in plans[goal]:
                started = time.perf_counter()
                answer = await http.post("/step", json={"env_idx": env_idx, "action": action})
                latencies.append(time.perf_counter() - started)
                answer.raise_for_status()
            episode += clients

    limits = httpx.Limits(max_connections=clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        seconds = time.perf_counter() - started
    return _figures(latencies, seconds)


async def store_load(redis_url: str, clients: int, steps: int) -> dict[str, Any]:
    """The session store's share of a step alone: ``RedisSessionStore.get`` + ``put`` (the two Lua scripts a
    ``/step`` runs, with a request key and a recorded answer as through the balancer) from ``clients``
    concurrent sessions, ``steps`` in all; store steps/s and latencies."""
    from agent_envs.api.compat_sessions import Answer, RedisSessionStore

    store = RedisSessionStore(redis_url, str, int, max_sessions=10_000, client_quota=10_000)
    latencies: list[float] = []
    answer = Answer(200, b'{"state": "' + b"x" * 600 + b'", "reward": 0.0, "done": false, "info": null}')

    async def session() -> None:
        env_idx = store.new_id()
        await store.create(env_idx, 0, "bench")
        while len(latencies) < steps:
            started = time.perf_counter()
            key = f"{len(latencies)}-{env_idx}"
            state, version = await store.get(env_idx, key, touch=False)
            await store.put(env_idx, state + 1, version, key, answer)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(session() for _ in range(clients)))
    seconds = time.perf_counter() - started
    await store.aclose()
    return _figures(latencies, seconds)


def _figures(latencies: list[float], seconds: float) -> dict[str, Any]:
    return {
        "steps_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
    }


def _medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds, and the rounds."""
    middle = len(results) // 2
    medians = {key: sorted(r[key] for r in results)[middle] for key in ("steps_per_s", "p50_ms", "p99_ms")}
    return {**medians, "rounds": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", type=Path, required=True, help="a prepared catalog")
    parser.add_argument("--modes", default="none,always", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--clients", type=int, default=32, help="AgentGym clients at once (default 32)")
    parser.add_argument("--steps", type=int, default=3000, help="steps per round and mode (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per mode (default 3)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per replica (default 1)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}: choose from {', '.join(MODES)}")
    http: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    alone: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as scratch:
        redis, records, urls = [], {}, {}
        try:
            for mode in modes:
                run_dir = Path(scratch) / mode
                process, urls[mode] = start_redis(mode, run_dir)
                redis.append(process)
                records[mode] = cluster.up(
                    replicas=2, catalog=args.catalog, base_port=0, port=0, workers=args.workers,
                    run_dir=run_dir, env={"AGENTRL_REDIS_URL": urls[mode]}, quiet=True,
                )  # fmt: skip
            url = records[modes[0]]["url"]
            plans = {
                g: httpx.get(f"{url}/v1/goals/{g}/expert", timeout=60).json()["actions"] for g in range(64)
            }
            plans = {goal: actions for goal, actions in plans.items() if actions}
            for _ in range(args.rounds):
                for mode in modes:
                    http[mode].append(
                        asyncio.run(load(records[mode]["url"], plans, args.clients, args.steps))
                    )
                    alone[mode].append(asyncio.run(store_load(urls[mode], args.clients, args.steps)))
        finally:
            for record in records.values():
                cluster.down(record["run_dir"], quiet=True)
            for process in redis:
                process.terminate()
                process.wait(timeout=30)
    summary = {mode: {"http": _medians(http[mode]), "store_alone": _medians(alone[mode])} for mode in modes}
    print(json.dumps({"clients": args.clients, "steps_per_round": args.steps, "modes": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
