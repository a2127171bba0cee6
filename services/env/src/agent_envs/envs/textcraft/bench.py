"""In-process figures for the TextCraft core: build time, reset and step latency, steps/s.

``python -m agent_envs.envs.textcraft.bench [--rounds N]``: every one of the 544 tasks is reset and its expert
plan stepped (the state goes through JSON between steps, as a token carries it; that is not timed). Prints
a table; figures depend on the machine, and no test asserts on them.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..expert_bench import play_expert_plans, print_figures
from .core import TextCraft


def run(rounds: int = 3) -> dict[str, Any]:
    started = time.perf_counter()
    env = TextCraft()
    build_s = time.perf_counter() - started
    plans = [env.expert(task) for task in range(env.task_count())]
    return {"build_ms": round(build_s * 1000, 1), **play_expert_plans(env, plans, rounds).figures()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="passes over the 544 expert episodes")
    args = parser.parse_args(argv)
    print_figures(run(args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
