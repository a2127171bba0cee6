"""Expert episodes from one test host, through a list of env addresses (its own node's first).

Run as a script inside a host's network namespace (``python _drive.py SPEC OUT``): SPEC is a JSON file
``{urls, plans: {goal: [actions]}, slots, seconds, think_s}``; OUT gets ``{episodes: [[goal, reward | error,
seconds]], worst_step_s, steps}``. Each slot runs episodes back to back until ``seconds`` have passed (at least
one each), so a fault injected meanwhile lands in the middle of episodes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from agent_envs.client import WebShopClient


async def drive(spec: dict) -> dict:
    plans = {int(goal): actions for goal, actions in spec["plans"].items()}
    goals = sorted(plans)
    episodes: list[list] = []
    worst = {"step_s": 0.0, "steps": 0}
    urls = spec["urls"]
    async with WebShopClient(
        urls[0], fallback_urls=urls[1:], timeout=spec.get("timeout", 5.0), retry_budget=spec.get("budget", 120.0),
        max_connections=spec["slots"] + 8, primary_retry_s=spec.get("primary_retry_s", 30.0),
    ) as client:  # fmt: skip

        async def timed(call, *args):
            started = time.monotonic()
            result = await call(*args)
            worst["step_s"] = max(worst["step_s"], time.monotonic() - started)
            worst["steps"] += 1
            return result

        deadline = time.monotonic() + spec["seconds"]

        async def slot(index: int) -> None:
            round_ = 0
            while round_ == 0 or time.monotonic() < deadline:
                goal = goals[(index + round_ * spec["slots"]) % len(goals)]
                started = time.monotonic()
                try:
                    step = await timed(client.reset, goal, "synthetic")
                    state, reward = step["state"], 0.0
                    for action in plans[goal]:
                        await asyncio.sleep(spec.get("think_s", 0.1))
                        step = await timed(client.step, state, action)
                        state, reward = step["state"], step["reward"]
                    episodes.append([goal, reward, time.monotonic() - started])
                except Exception as error:  # a lost episode
                    episodes.append([goal, f"{type(error).__name__}: {error}", time.monotonic() - started])
                round_ += 1

        await asyncio.gather(*(slot(i) for i in range(spec["slots"])))
    return {"episodes": episodes, "worst_step_s": worst["step_s"], "steps": worst["steps"]}


if __name__ == "__main__":
    spec_path, out_path = sys.argv[1], sys.argv[2]
    result = asyncio.run(drive(json.loads(Path(spec_path).read_text())))
    Path(out_path).write_text(json.dumps(result))
