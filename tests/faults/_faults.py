"""Helpers of the fault-tolerance suite (imported as ``_faults``; conftest puts this folder on sys.path).

``FIGURES`` collects one line per measured figure; conftest prints them at the end of the run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from agent_envs import cluster
from agent_envs.client import WebShopClient

SECRET = "faults-suite-secret-0123456789-abcdef"
FIGURES: list[str] = []
CONCURRENT = 64  # episodes in flight at once in the load runs
FUZZ = {"cases": 0, "failures": 0}  # schemathesis cases run / failed (test_fuzz_all_checks)
THINK_S = 0.2  # the policy's time per turn: a fault lands in the middle of episodes


def figure(line: str) -> None:
    """Record a figure for the summary at the end of the run (and print it for -s runs)."""
    FIGURES.append(line)
    print(line)


def start(
    catalog: Path, run_dir: Path, replicas: int = 2, workers: int = 2, env: Mapping[str, str] | None = None
) -> dict:
    """The local cluster (replicas x workers, Redis, nginx) on free ports; ``cluster.down(run_dir)`` stops it."""
    return cluster.up(
        replicas=replicas, catalog=catalog, base_port=0, port=0, workers=workers, run_dir=run_dir,
        env={"AGENTRL_STATE_SECRET": SECRET, "AGENTRL_WATCHDOG_INTERVAL_S": "0", **(env or {})},
        timeout=120, quiet=True,
    )  # fmt: skip


def signal_replica(record: Mapping[str, Any], index: int, sig: signal.Signals) -> None:
    """Signal every process of replica ``index`` (its uvicorn parent and workers: one process group)."""
    replica = record["replicas"][index]
    os.killpg(replica.get("pgid", replica["pid"]), sig)


async def native_episode(
    client: WebShopClient, goal: int, actions: Sequence[str], think_s: float = 0.0
) -> tuple[float, float]:
    """(final reward, seconds) of one native episode; ``think_s`` between steps stands for the policy."""
    started = time.monotonic()
    step = await client.reset(goal, goal_set="synthetic")
    state, reward = step["state"], 0.0
    for action in actions:
        if think_s:
            await asyncio.sleep(think_s)
        step = await client.step(state, action)
        state, reward = step["state"], step["reward"]
    return reward, time.monotonic() - started


def native_trace(url: str, goal: int, actions: Sequence[str]) -> list[tuple[str, float, bool]]:
    """(observation, reward, done) after reset and after each action, through the native protocol."""
    with requests.Session() as http:
        first = http.post(f"{url}/v1/reset", json={"goal": goal, "goal_set": "synthetic"}, timeout=30).json()
        trace = [(first["observation"], 0.0, False)]
        state = first["state"]
        for action in actions:
            step = http.post(f"{url}/v1/step", json={"state": state, "action": action}, timeout=30).json()
            trace.append((step["observation"], step["reward"], step["done"]))
            state = step["state"]
            if step["done"]:
                break
    return trace


async def run_slots(
    url: str, plans: dict[int, list[str]], retries: int | None, seconds: float, on_started=None
):
    """``CONCURRENT`` slots, each running episodes back to back for ``seconds`` (at least one each);
    returns [(goal, reward or exception, duration)]."""
    goals = list(plans)[:CONCURRENT]
    results: list[tuple[int, object, float]] = []
    async with WebShopClient(url, retries=retries, max_connections=CONCURRENT + 8) as client:
        deadline = time.monotonic() + seconds

        async def slot(index: int) -> None:
            round_ = 0
            while round_ == 0 or time.monotonic() < deadline:
                goal = goals[(index + round_) % len(goals)]
                started = time.monotonic()
                try:
                    reward, _ = await native_episode(client, goal, plans[goal], THINK_S)
                    results.append((goal, reward, time.monotonic() - started))
                except Exception as error:  # a lost episode
                    results.append((goal, error, time.monotonic() - started))
                round_ += 1

        tasks = [asyncio.create_task(slot(i)) for i in range(CONCURRENT)]
        if on_started is not None:
            await on_started()
        await asyncio.gather(*tasks)
    return results
