"""SciWorld benchmark: what a reset costs from the warm pool and from a cold JVM, step latency, replay cost, and
the memory of one JVM. Prints the figures (``python -m agent_envs.envs.sciworld.bench``); nothing asserts on
them. Figures in docs/environments/sciworld.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

from .core import SciWorldEnv
from .games import game
from .pool import JvmPool, Simulator

TASKS = (1436, 3811, 4136, 660)  # test-conductivity, find-plant, chemistry-mix, measure-melting-point


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cold_resets(resets: int, tasks: Sequence[int] = TASKS) -> tuple[list[float], list[float]]:
    """Resets as AgentGym's ``/create`` + ``/reset`` cost them: start a JVM, then load + look. (seconds, RSS MiB
    of each JVM before its load)."""
    cold, spare_rss = [], []
    for n in range(resets):
        started = time.perf_counter()
        sim = Simulator()
        spare_rss.append(rss_mib(sim.pid))
        sim.load(*game(tasks[n % len(tasks)]))
        cold.append(time.perf_counter() - started)
        sim.close()
    return cold, spare_rss


def warm_resets(env: SciWorldEnv, resets: int, tasks: Sequence[int] = TASKS) -> list[float]:
    """Resets from the warm pool (a spare is ready when the reset comes, as on a replica between requests)."""
    warm = []
    for n in range(resets):
        env.pool.wait_for_spares()
        started = time.perf_counter()
        first = env.reset(tasks[n % len(tasks)])
        warm.append(time.perf_counter() - started)
        env.close(first.state)
    return warm


def bench(resets: int = 4, tasks: Sequence[int] = TASKS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["cold_reset_s"], spare_rss = cold_resets(resets, tasks)
    env = SciWorldEnv(JvmPool(spares=2, max_live=8, wait_s=300))
    try:
        out["warm_reset_s"] = warm_resets(env, resets, tasks)

        steps, loaded_rss, states = [], [], []
        for task in tasks:
            held = float("nan")
            actions = list(env.expert(task) or [])[:30]
            result = env.reset(task)
            for action in actions:
                if result.done:
                    break
                started = time.perf_counter()
                result = env.step(result.state, action)
                steps.append(time.perf_counter() - started)
                states.append(result.state)
                live = env.pool.holds(result.state["episode"])  # None once done (its JVM is closed)
                if live is not None:
                    held = rss_mib(live.pid)
            loaded_rss.append(held)
            env.close(result.state)
        out["step_s"] = steps
        out["rss_mib"] = {"spare": spare_rss, "after_episode": loaded_rss}

        # A step whose JVM is gone: a fresh JVM replays the actions first (spares ready, as on a warm replica).
        replays = []
        for state in [s for s in states if len(s["actions"]) in (5, 15)]:
            env.pool.wait_for_spares()
            env.close(state)
            started = time.perf_counter()
            env.step(state, "look around")
            replays.append((len(state["actions"]), time.perf_counter() - started))
        out["replay_step_s"] = replays
    finally:
        env.shutdown()
    return out


def report(figures: dict[str, Any]) -> str:
    def ms(values: Sequence[float]) -> str:
        return (
            f"p50 {1000 * statistics.median(values):7.1f} ms  p99 {1000 * percentile(values, 0.99):7.1f} ms  "
            f"n={len(values)}"
        )

    lines = [
        f"reset, cold JVM (start + load + look)  {ms(figures['cold_reset_s'])}",
        f"reset, warm pool (load + look)         {ms(figures['warm_reset_s'])}",
        f"step, live JVM                         {ms(figures['step_s'])}",
    ]
    for count, seconds in figures["replay_step_s"]:
        lines.append(
            f"step after {count:2d} actions, JVM gone      {1000 * seconds:7.1f} ms (replay in a warm spare)"
        )
    rss = figures["rss_mib"]
    lines.append(
        f"RSS per JVM: spare {statistics.median(rss['spare']):.0f} MiB, after an episode "
        f"{statistics.median(rss['after_episode']):.0f} MiB (max {max(rss['after_episode']):.0f})"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--resets", type=int, default=4)
    args = parser.parse_args(argv)
    print(report(bench(args.resets)))


if __name__ == "__main__":
    main()
