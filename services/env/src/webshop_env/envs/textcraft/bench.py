"""In-process figures for the TextCraft core: build time, reset and step latency, steps/s.

``python -m webshop_env.envs.textcraft.bench [--rounds N]``: every one of the 544 tasks is reset and its expert
plan stepped (the state goes through JSON between steps, as a token carries it; that is not timed). Prints
a table; figures depend on the machine, and no test asserts on them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from .core import TextCraft


def _ms(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run(rounds: int = 3) -> dict[str, Any]:
    started = time.perf_counter()
    env = TextCraft()
    build_s = time.perf_counter() - started
    plans = [env.expert(task) for task in range(env.task_count())]
    resets: list[float] = []
    steps: list[float] = []
    state_bytes: list[int] = []
    stepping = 0.0
    for _ in range(rounds):
        for task, plan in enumerate(plans):
            t = time.perf_counter()
            state = env.reset(task).state
            resets.append(time.perf_counter() - t)
            for action in plan:
                t = time.perf_counter()
                transition = env.step(state, action)
                took = time.perf_counter() - t
                steps.append(took)
                stepping += took
                state = json.loads(json.dumps(transition.state))  # as a token carries it (not timed)
            state_bytes.append(len(json.dumps(state, separators=(",", ":"))))
    return {
        "build_ms": round(build_s * 1000, 1),
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
    parser.add_argument("--rounds", type=int, default=3, help="passes over the 544 expert episodes")
    args = parser.parse_args(argv)
    figures = run(args.rounds)
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
