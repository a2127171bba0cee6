"""In-process figures for the Sokoban core: room generation, reset and step latency, steps/s, the expert's search
and plan lengths, token sizes.

``python -m agent_envs.envs.sokoban.bench [--tasks N] [--rounds N]``: the first ``N`` tasks' rooms are generated
(cold: gym-sokoban's generator), reset again (warm: the cached room), their expert plans searched and stepped (the
state goes through JSON between steps, as a token carries it; that is not timed). Prints a table; figures depend on
the machine, and no test asserts on them.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..expert_bench import play_expert_plans, print_figures, quantile_ms
from . import rooms
from .core import Sokoban


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
    played = play_expert_plans(env, plans, rounds)
    lengths = [len(plan) for plan in plans]
    return {
        "build_ms": round(build_s * 1000, 1),
        "tasks": tasks,
        "rooms_from_a_derived_seed": sum(rooms.room(task).seed != task for task in range(tasks)),
        "generate_p50_ms": round(quantile_ms(cold, 0.5), 2),
        "generate_p99_ms": round(quantile_ms(cold, 0.99), 2),
        "generate_total_s": round(sum(cold), 2),
        "expert_p50_ms": round(quantile_ms(searches, 0.5), 3),
        "expert_p99_ms": round(quantile_ms(searches, 0.99), 3),
        "plan_length_mean": round(sum(lengths) / len(lengths), 2),
        "plan_length_max": max(lengths),
        "plans_within_20_steps": round(sum(n <= 20 for n in lengths) / len(lengths), 4),
        "expert_success": round(played.solved / (rounds * tasks), 4),
        **played.figures(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000, help="the first N tasks (10,000 in all)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the expert episodes")
    args = parser.parse_args(argv)
    print_figures(run(args.tasks, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
