"""Where an AgentGym step's time goes on the deployed path, beside AgentGym's own server: the same AgentGym
requests (``/step`` after ``/step`` on sessions created once, a ``/reset`` every 20 steps, as a training loop
does) against several targets, in alternating rounds so that a shared machine's noise falls on each alike.
Prints JSON; asserts nothing.

    .venv/bin/python scripts/bench_agentgym_path.py --env textcraft --agentgym http://127.0.0.1:36201
    .venv/bin/python scripts/bench_agentgym_path.py --env babyai --clients 1,8 --agentgym http://127.0.0.1:36202

A session starts a new episode every 20 steps, and when one ends (``done``, or an error answer). Targets:
``balancer`` (nginx -> replica -> Redis: what AgentGym's clients are given), ``replica`` (one replica
directly: nginx's share is the difference), ``store-always`` (the balancer again, with the session store fsyncing
every write: ``SESSIONS_APPENDFSYNC=always``; the default is everysec) and ``agentgym`` (AgentGym's own server,
one process, where ``--agentgym`` names one: start it from AgentGym's repository, docs/performance.md). For each:
steps/s, step latency p50/p99 as the client sees it, and the CPU each server-side process spent per step
(``/proc``: nginx, the replicas, Redis; AgentGym's one process), so that ratios mean something on a busy machine.
The driver is one asyncio process with keep-alive connections (its own CPU per step is printed too: on a small
machine it is a large share of the whole).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agent_envs import cluster
from agent_envs.bench import percentile

ACTIONS = {
    "textcraft": ["inventory", "get 1 oak logs", "inventory"],
    "babyai": ["turn left", "turn right", "move forward", "turn left"],
}
CREATE_BODY = {"textcraft": {"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None}}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their children (uvicorn workers, nginx workers)."""
    every = set(pids)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent in pids:
                every.add(int(entry.name))
    total = 0
    for pid in every:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


async def load(base: str, env: str, clients: int, steps: int) -> dict[str, Any]:
    """``clients`` sessions stepping until ``steps`` steps in all: steps/s and step latencies."""
    latencies: list[float] = []
    errors = 0
    async with httpx.AsyncClient(
        base_url=base, timeout=60, limits=httpx.Limits(max_connections=clients + 2)
    ) as http:
        body = CREATE_BODY.get(env)
        ids = []
        for _ in range(clients):
            created = await (http.post("/create", json=body) if body else http.post("/create"))
            ids.append(created.json()["id"])
        for number, env_idx in enumerate(ids):
            await http.post("/reset", json={"id": env_idx, "data_idx": 3 + number})

        async def client(number: int, env_idx: int) -> None:
            nonlocal errors
            count, over = 0, False
            while len(latencies) < steps:
                if over or (count and count % 20 == 0):  # a new episode: every 20 steps, or when one ended
                    await http.post("/reset", json={"id": env_idx, "data_idx": 3 + number + count})
                action = ACTIONS[env][count % len(ACTIONS[env])]
                started = time.perf_counter()
                answer = await http.post("/step", json={"action": action, "id": env_idx})
                latencies.append(time.perf_counter() - started)
                body = answer.json() if answer.status_code == 200 else {}
                errors += answer.status_code != 200
                over = not isinstance(body, dict) or "error" in body or bool(body.get("done"))
                count += 1

        started = time.perf_counter()
        await asyncio.gather(*(client(n, i) for n, i in enumerate(ids)))
        seconds = time.perf_counter() - started
        for env_idx in ids:
            await http.post("/close", json={"id": env_idx})
    return {"steps_per_s": len(latencies) / seconds, "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000, "errors": errors}  # fmt: skip


def measure(base: str, env: str, clients: int, steps: int, processes: dict[str, list[int]]) -> dict[str, Any]:
    before = {name: cpu_seconds(pids) for name, pids in processes.items()}
    driver = time.process_time()
    figures = asyncio.run(load(base, env, clients, steps))
    figures["driver_cpu_us_per_step"] = (time.process_time() - driver) / steps * 1e6
    figures["server_cpu_us_per_step"] = {
        name: (cpu_seconds(pids) - before[name]) / steps * 1e6 for name, pids in processes.items()
    }
    figures["load"] = os.getloadavg()[0]
    return figures


def _cluster(run_dir: Path, env: str, fsync: str) -> dict[str, Any]:
    return cluster.up(
        replicas=2, catalog=run_dir, base_port=0, port=0, workers=1, run_dir=run_dir, timeout=180, quiet=True,
        env={"AGENTRL_ENVS": env, "AGENTRL_ALLOW_EPHEMERAL_SECRET": "1", "SESSIONS_APPENDFSYNC": fsync},
    )  # fmt: skip


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    middle = len(rounds) // 2
    pick = lambda key: sorted(r[key] for r in rounds)[middle]  # noqa: E731
    servers = {name: sorted(r["server_cpu_us_per_step"][name] for r in rounds)[middle]
               for name in rounds[0]["server_cpu_us_per_step"]}  # fmt: skip
    return {
        "steps_per_s": round(pick("steps_per_s"), 1), "p50_ms": round(pick("p50_ms"), 2),
        "p99_ms": round(pick("p99_ms"), 2), "errors": sum(r["errors"] for r in rounds),
        "server_cpu_us_per_step": {name: round(value) for name, value in servers.items()},
        "server_cpu_us_per_step_total": round(sum(servers.values())),
        "driver_cpu_us_per_step": round(pick("driver_cpu_us_per_step")),
        "load": [round(r["load"], 1) for r in rounds],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(ACTIONS), default="textcraft")
    parser.add_argument("--clients", default="1,8", help="comma-separated concurrencies (default 1,8)")
    parser.add_argument("--steps", type=int, default=2000, help="steps per round and target (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--agentgym", default=None, help="a running AgentGym server of --env (its base URL)")
    parser.add_argument("--agentgym-pid", type=int, default=None, help="its process id (for its CPU)")
    parser.add_argument("--no-always", action="store_true", help="leave out the fsync-always store")
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-agentgym-path-") as scratch:
        records = {}
        try:
            for fsync in ("everysec",) + (() if args.no_always else ("always",)):
                records[fsync] = _cluster(Path(scratch) / fsync, args.env, fsync)
            deployed = records["everysec"]
            processes = lambda record: {  # noqa: E731
                "nginx": [record["nginx"]["pid"]], "replicas": [r["pid"] for r in record["replicas"]],
                "redis": [record["redis"]["pid"]],
            }  # fmt: skip
            targets: dict[str, tuple[str, dict[str, list[int]]]] = {
                "balancer": (f"{deployed['url']}/{args.env}", processes(deployed)),
                "replica": (f"{deployed['replicas'][0]['url']}/{args.env}",
                            {"replicas": [deployed["replicas"][0]["pid"]], "redis": [deployed["redis"]["pid"]]}),
            }  # fmt: skip
            if "always" in records:
                targets["store-always"] = (
                    f"{records['always']['url']}/{args.env}",
                    processes(records["always"]),
                )
            if args.agentgym:
                targets["agentgym"] = (
                    args.agentgym,
                    {"agentgym": [args.agentgym_pid]} if args.agentgym_pid else {},
                )
            results: dict[str, dict[str, list[dict[str, Any]]]] = {}
            for clients in concurrencies:
                rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
                for _ in range(args.rounds):
                    for name, (base, pids) in targets.items():
                        rounds[name].append(measure(base, args.env, clients, args.steps, pids))
                results[str(clients)] = rounds
        finally:
            for record in records.values():
                cluster.down(record["run_dir"], quiet=True)
    summary = {
        clients: {name: _medians(rounds) for name, rounds in by_target.items()}
        for clients, by_target in results.items()
    }
    print(json.dumps({"env": args.env, "steps_per_round": args.steps, "cpus": os.cpu_count(),
                      "clients": summary}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
