"""In-process BabyAI benchmark: reset and step latency (p50/p99), steps per second on the warm path, the cost
of rebuilding an episode from its state token on a replica that lacks it (20 and 30 steps, the AgentGym-RL
round limits), and token sizes. Prints figures; asserts nothing.

    python -m agent_envs.envs.babyai.bench [--episodes 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from .core import BabyAI
from .levels import LEVELS


def _percentiles(samples: Sequence[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms  (n={len(ordered)})"


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _long_walk(env: BabyAI, task: int, steps: int, rng: random.Random) -> list[tuple[Any, str]]:
    """(state, action) pairs of a random walk that prefers the longest listed actions (the most primitives per
    step: the worst case for a replay)."""
    transition = env.reset(task)
    pairs = []
    for _ in range(steps):
        if transition.done:
            break
        listed = [a for a in transition.info["available_actions"] if a != "check available actions"]
        action = max(listed, key=len) if rng.random() < 0.7 else rng.choice(listed)
        pairs.append((transition.state, action))
        transition = env.step(transition.state, action)
    if not transition.done:
        pairs.append((transition.state, "turn left"))
    return pairs  # the last pair: the longest state with a step still allowed


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=40, help="random episodes (one per level by default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    tasks = [rng.randrange(40 * 5000) for _ in range(args.episodes)]

    env = BabyAI()
    cold_resets = [_timed(lambda t=t: env.reset(t))[0] for t in tasks]
    warm_resets = [_timed(lambda t=t: env.reset(t))[0] for t in tasks]
    print(f"reset, new level (gymnasium.make + generation)   {_percentiles(cold_resets)}")
    print(f"reset, level cached (copy of the fresh level)    {_percentiles(warm_resets)}")

    steps: list[float] = []
    tokens: list[int] = []
    started = time.perf_counter()
    for task in tasks:
        transition = env.reset(task)
        for _ in range(20):
            if transition.done:
                break
            action = rng.choice(transition.info["available_actions"])
            elapsed, transition = _timed(lambda s=transition.state, a=action: env.step(s, a))
            steps.append(elapsed)
            tokens.append(len(json.dumps(transition.state, separators=(",", ":"))))
    wall = time.perf_counter() - started
    print(f"step, warm (cached live episode)                 {_percentiles(steps)}")
    print(f"steps/s, one thread, warm path incl. resets      {len(steps) / wall:7.1f}")
    print(
        f"state JSON size, random 20-step episodes         max {max(tokens)} B, mean {statistics.mean(tokens):.0f} B"
    )
    print(f"cache hits/misses so far                          {env.live.hits}/{env.live.misses}")

    for rounds in (20, 30):
        replays, fresh_replays, sizes = [], [], []
        for level in range(len(LEVELS)):
            walk = _long_walk(env, level + 40 * rng.randrange(5000), rounds, rng)
            state, action = walk[-1]
            sizes.append(len(json.dumps(state, separators=(",", ":"))))
            lacking = BabyAI(
                episode_cache=0
            )  # fresh levels cached, live episodes not: the usual cold replica
            lacking.reset(state["task"])
            replays.append(_timed(lambda s=state, a=action, e=lacking: e.step(s, a))[0])
            nothing = BabyAI(episode_cache=0, fresh_cache=0)  # a replica that has never seen the task
            fresh_replays.append(_timed(lambda s=state, a=action, e=nothing: e.step(s, a))[0])
        print(f"cold step after {rounds} steps, level cached        {_percentiles(replays)}")
        print(f"cold step after {rounds} steps, nothing cached      {_percentiles(fresh_replays)}")
        print(f"state JSON size after {rounds} long steps           max {max(sizes)} B")


if __name__ == "__main__":
    main()
