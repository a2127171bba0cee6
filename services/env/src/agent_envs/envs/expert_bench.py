"""What the in-process benchmarks of the cores share: expert plans played through a core with the state going
through JSON between steps (as a token carries it; not timed), their reset and step latencies, and the table they
print. ``textcraft.bench`` and ``sokoban.bench`` add what is their own (the recipe table's build, the rooms'
generation and the expert's search)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .contract import TextEnv


def quantile_ms(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1; the value at rank ``int(q * n)``) of ``samples`` in seconds, in milliseconds."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@dataclass
class ExpertRun:
    """The timings of expert plans played through a core: each reset and step (seconds), the time spent stepping,
    each episode's final state's size in JSON, and how many episodes ended with ``info["success"]``."""

    resets: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    stepping: float = 0.0
    state_bytes: list[int] = field(default_factory=list)
    solved: int = 0

    def figures(self) -> dict[str, Any]:
        """Episodes, steps, reset and step latency (µs), steps/s and the largest final state (bytes)."""
        return {
            "episodes": len(self.resets),
            "steps": len(self.steps),
            "reset_p50_us": round(quantile_ms(self.resets, 0.5) * 1000, 2),
            "reset_p99_us": round(quantile_ms(self.resets, 0.99) * 1000, 2),
            "step_p50_us": round(quantile_ms(self.steps, 0.5) * 1000, 2),
            "step_p99_us": round(quantile_ms(self.steps, 0.99) * 1000, 2),
            "steps_per_s": round(len(self.steps) / self.stepping),
            "final_state_bytes_max": max(self.state_bytes),
        }


def play_expert_plans(env: TextEnv, plans: Sequence[Sequence[str]], rounds: int) -> ExpertRun:
    """Task ``i``'s plan ``plans[i]`` played from its reset, ``rounds`` times over; each step's state goes through
    JSON before the next (as a token carries it; not timed)."""
    run = ExpertRun()
    for _ in range(rounds):
        for task, plan in enumerate(plans):
            t = time.perf_counter()
            transition = env.reset(task)
            run.resets.append(time.perf_counter() - t)
            state = transition.state
            for action in plan:
                t = time.perf_counter()
                transition = env.step(state, action)
                took = time.perf_counter() - t
                run.steps.append(took)
                run.stepping += took
                state = json.loads(json.dumps(transition.state))
            run.solved += bool(transition.info.get("success"))
            run.state_bytes.append(len(json.dumps(state, separators=(",", ":"))))
    return run


def print_figures(figures: Mapping[str, Any]) -> None:
    """One figure a line, names aligned."""
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value}")
