"""``agent-envs bench-http --calibrate``: the service's HTTP step cost against the web stack's own floor.

Absolute figures on a shared machine say little, so this measures a ratio in one run. Two local clusters
with the same topology start side by side (``agent_envs.cluster``: N replicas, the same ``serve`` command
and uvicorn settings, the same nginx template, Redis): one serves the environment, the other the trivial
app of ``api.calibration``. The same requests then go to both, in alternating rounds, from a lean HTTP/1.1
load generator (keep-alive connections, pre-built request bytes). Per side it reports steps/s (median of
the rounds), latency percentiles over every request, server CPU per step (user + system time of every
process of the cluster: replicas, their workers, nginx, Redis) and errors; ``ratio`` is service over
calibration steps/s and ``cpu_ratio`` service over calibration CPU per step.

Kinds of load (``--kind``), all ``POST /v1/step`` with valid signed states:
  click          clicks on item pages (options, description, features, reviews, back), cycled;
  search         the same search from the search page (the search cache answers after the first);
  search-varied  a different query each time (instructions with a counter appended): every search scores.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from .bench import percentile

KINDS = ("click", "search", "search-varied")
CALIBRATION_FACTORY = "agent_envs.api.calibration:create_app"


# ---- requests --------------------------------------------------------------------------------------------
def step_requests(catalog_dir: Path, secret: str, kind: str, seed: int = 0) -> Callable[[int], bytes]:
    """``request(i)``: the i-th request body of this kind (signed for ``secret`` and this catalog)."""
    from .envs.webshop.catalog.store import open_catalog
    from .envs.webshop.core.env import WebShopEnv
    from .envs.webshop.core.oracle import expert_actions
    from .envs.webshop.http import token_codec

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    catalog = open_catalog(catalog_dir)
    env = WebShopEnv(catalog)
    codec = token_codec(secret.encode(), catalog.fingerprint)
    goal_set = "human" if "human" in catalog.goal_sets else catalog.goal_sets[0]
    goals = catalog.goal_count(goal_set)
    rng = random.Random(seed)

    def body(state: str, action: str) -> bytes:
        return orjson.dumps({"state": state, "action": action})

    if kind == "click":
        bodies = []
        for goal in rng.sample(range(goals), min(goals, 60)):
            actions = expert_actions(env, goal, goal_set=goal_set)
            if len(actions) < 3:
                continue
            step = env.reset(goal, goal_set=goal_set)
            for action in actions[:2]:  # search, then the product: an item page
                step = env.step(step.state, action)
            token = codec.encode(step.state)
            labels = [c for c in step.available_actions["clickables"] if c != "buy now"]
            bodies += [body(token, f"click[{label}]") for label in labels]
        if not bodies:
            raise RuntimeError("no goal of this catalog reached an item page; cannot build click requests")
        rng.shuffle(bodies)
        return lambda i: bodies[i % len(bodies)]

    start = codec.encode(env.reset(0, goal_set=goal_set).state)
    queries = [catalog.goal(goal_set, rng.randrange(goals)).instruction_text for _ in range(997)]
    if kind == "search":
        same = body(start, f"search[{queries[0]}]")
        return lambda i: same
    prefix = orjson.dumps({"state": start, "action": ""})[:-2]  # ..."action":"   then the action, then "}
    return lambda i: prefix + orjson.dumps(f"search[{queries[i % len(queries)]} {i}]")[1:] + b"}"


# ---- load generator --------------------------------------------------------------------------------------
class Load:
    """Counters and latencies of one measured window."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.statuses: dict[str, int] = {}  # non-200 answers by status ("connection" for a dropped one)
        self.completed = 0  # in the measured window
        self.total = 0  # warm-up included (the CPU figure covers both)


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on a keep-alive connection and read its whole response: (status, body). Lean
    on purpose (no header parsing beyond the body's length): a load generator sharing the cores with the
    servers it measures should cost them as little as it can (also used by ``envs.bench_agentgym``)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at >= 0:
        end = lower.index(b"\r\n", at + 2)
        return status, await reader.readexactly(int(head[at + 17 : end]))
    chunks = []
    if b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunks.append((await reader.readexactly(size + 2))[:-2])
            if size == 0:
                break
    return status, b"".join(chunks)


async def run_load(
    host: str,
    port: int,
    request: Callable[[int], bytes],
    counter: itertools.count,  # type: ignore[type-arg]
    connections: int,
    seconds: float,
    warmup: float,
) -> Load:
    """``connections`` keep-alive connections sending ``POST /v1/step`` back to back; measures after warm-up."""
    head = f"POST /v1/step HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n".encode()
    load = Load()
    measuring_from = time.perf_counter() + warmup
    stop_at = measuring_from + seconds

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while (now := time.perf_counter()) < stop_at:
                body = request(next(counter))
                message = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
                try:
                    status, _ = await exchange(reader, writer, message)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    load.errors += 1
                    load.statuses["connection"] = load.statuses.get("connection", 0) + 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    continue
                load.total += 1
                if now >= measuring_from:
                    load.latencies.append(time.perf_counter() - now)
                    load.completed += 1
                    if status != 200:
                        load.errors += 1
                        load.statuses[str(status)] = load.statuses.get(str(status), 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return load


# ---- server CPU ------------------------------------------------------------------------------------------
def cluster_cpu_seconds(record: dict[str, Any]) -> float:
    """User + system CPU seconds of every live process in the cluster's process groups (workers included)."""
    groups = {p["pgid"] for p in [*record["replicas"], record["nginx"], record.get("redis")] if p}
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # after the command: state ppid pgrp session ... utime(12) stime(13) (0-based in this slice)
        if int(fields[2]) in groups:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


# ---- the calibrated run ----------------------------------------------------------------------------------
def calibrate(
    catalog_dir: Path,
    kind: str = "click",
    replicas: int = 2,
    workers: int = 1,
    connections: int = 64,
    seconds: float = 5.0,
    rounds: int = 3,
    warmup: float = 1.0,
) -> dict[str, Any]:
    """Start both clusters, run ``rounds`` alternating windows against each, stop them; returns the figures."""
    from . import cluster

    secret = secrets.token_urlsafe(32)
    request = step_requests(catalog_dir, secret, kind)
    env = {"AGENTRL_STATE_SECRET": secret}
    sides: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="webshop-calibrate-") as scratch:
        records = {}
        try:
            for side, serve_args in (
                ("calibration", ["--app-factory", CALIBRATION_FACTORY]),
                ("service", []),
            ):
                records[side] = cluster.up(
                    replicas=replicas, catalog=catalog_dir, base_port=0, port=0, workers=workers,
                    run_dir=Path(scratch) / side, env=env, quiet=True, serve_args=serve_args,
                )  # fmt: skip
            counter = itertools.count()  # one sequence for both: varied searches never repeat
            windows: dict[str, list[tuple[Load, float]]] = {side: [] for side in records}
            for _ in range(rounds):
                for side, record in records.items():
                    before = cluster_cpu_seconds(record)
                    load = asyncio.run(
                        run_load("127.0.0.1", record["port"], request, counter, connections, seconds, warmup)
                    )
                    windows[side].append((load, cluster_cpu_seconds(record) - before))
        finally:
            for side in records:
                cluster.down(Path(scratch) / side, quiet=True)
    for side, runs in windows.items():
        latencies = [x for load, _ in runs for x in load.latencies]
        sides[side] = {
            "steps_per_s": round(statistics.median(load.completed / seconds for load, _ in runs), 1),
            "p50_ms": round(percentile(latencies, 0.50) * 1000, 3),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
            "server_cpu_us_per_step": round(
                sum(cpu for _, cpu in runs) / max(1, sum(load.total for load, _ in runs)) * 1e6, 1
            ),
            "errors": sum(load.errors for load, _ in runs),
            "error_statuses": _merged([load.statuses for load, _ in runs]),
            "steps": sum(load.completed for load, _ in runs),
        }
    calibration, service = sides["calibration"], sides["service"]
    return {
        "kind": kind,
        "calibration": calibration,
        "service": service,
        "ratio": round(service["steps_per_s"] / calibration["steps_per_s"], 3)
        if calibration["steps_per_s"]
        else 0.0,
        "cpu_ratio": round(service["server_cpu_us_per_step"] / calibration["server_cpu_us_per_step"], 3)
        if calibration["server_cpu_us_per_step"]
        else 0.0,
        "replicas": replicas,
        "workers": workers,
        "connections": connections,
        "seconds": seconds,
        "rounds": rounds,
        "catalog": str(catalog_dir),
        "cpu_count": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def _merged(counts: list[dict[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for count in counts:
        for key, value in count.items():
            merged[key] = merged.get(key, 0) + value
    return merged
