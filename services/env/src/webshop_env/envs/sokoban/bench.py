"""In-process figures for the Sokoban core: room generation, reset and step latency, steps/s, the expert's search
and plan lengths, token sizes.

``python -m webshop_env.envs.sokoban.bench [--tasks N] [--rounds N]``: the first ``N`` tasks' rooms are generated
(cold: gym-sokoban's generator), reset again (warm: the cached room), their expert plans searched and stepped (the
state goes through JSON between steps, as a token carries it; that is not timed). Prints a table; figures depend on
the machine, and no test asserts on them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from . import rooms
from .core import Sokoban


def _ms(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run(tasks: int = 1000, rounds: int = 3) -> dict[str, Any]:
    started = time.perf_counter()
    env = Sokoban()
    build_s = time.perf_counter() - started
    rooms.room.cache_clear()
    tasks = min(tasks, env.task_count())
    cold: list[float] = []
    for task in range(tasks):
        t = time.perf_counter()
        env.reset(task)
        cold.append(time.perf_counter() - t)
    searches: list[float] = []
    plans: list[list[str]] = []
    for task in range(tasks):
        t = time.perf_counter()
        plans.append(env.expert(task))
        searches.append(time.perf_counter() - t)
    resets: list[float] = []
    steps: list[float] = []
    state_bytes: list[int] = []
    solved = 0
    stepping = 0.0
    for _ in range(rounds):
        for task, plan in enumerate(plans):
            t = time.perf_counter()
            transition = env.reset(task)
            resets.append(time.perf_counter() - t)
            state = transition.state
            for action in plan:
                t = time.perf_counter()
                transition = env.step(state, action)
                took = time.perf_counter() - t
                steps.append(took)
                stepping += took
                state = json.loads(json.dumps(transition.state))  # as a token carries it (not timed)
            solved += bool(transition.info["success"])
            state_bytes.append(len(json.dumps(state, separators=(",", ":"))))
    lengths = [len(plan) for plan in plans]
    return {
        "build_ms": round(build_s * 1000, 1),
        "tasks": tasks,
        "rooms_from_a_derived_seed": sum(rooms.room(task).seed != task for task in range(tasks)),
        "generate_p50_ms": round(_ms(cold, 0.5), 2),
        "generate_p99_ms": round(_ms(cold, 0.99), 2),
        "generate_total_s": round(sum(cold), 2),
        "expert_p50_ms": round(_ms(searches, 0.5), 3),
        "expert_p99_ms": round(_ms(searches, 0.99), 3),
        "plan_length_mean": round(sum(lengths) / len(lengths), 2),
        "plan_length_max": max(lengths),
        "plans_within_20_steps": round(sum(n <= 20 for n in lengths) / len(lengths), 4),
        "expert_success": round(solved / (rounds * tasks), 4),
        "episodes": len(resets),
        "steps": len(steps),
        "reset_p50_us": round(_ms(resets, 0.5) * 1000, 2),
        "reset_p99_us": round(_ms(resets, 0.99) * 1000, 2),
        "step_p50_us": round(_ms(steps, 0.5) * 1000, 2),
        "step_p99_us": round(_ms(steps, 0.99) * 1000, 2),
        "steps_per_s": round(len(steps) / stepping),
        "final_state_bytes_max": max(state_bytes),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000, help="the first N tasks (10,000 in all)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the expert episodes")
    args = parser.parse_args(argv)
    figures = run(args.tasks, args.rounds)
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
