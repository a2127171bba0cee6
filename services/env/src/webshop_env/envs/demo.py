"""Expert and random episodes of one environment through a running service: the two ends of the scale a
trained model lands between (``make demo`` for every enabled environment besides WebShop).

- expert: the environment's own ``expert`` actions;
- random: at every step a uniformly random action among the ones the environment lists (``available_actions``
  in ``info``, BabyAI) or else among the actions of other tasks' expert plans (plausible commands of the right
  form, mostly useless for this task), with a fixed seed.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from ..client import EnvClient
from . import registry


def _action_pool(env_id: str, tasks: list[int]) -> list[str]:
    env = registry.make(env_id)
    pool: list[str] = []
    for task in tasks[:20]:
        pool.extend(env.expert(task) or [])
    return sorted(set(pool)) or ["inventory"]


async def _episode(client: EnvClient, task: int, policy: str, plan: list[str], pool: list[str],
                   rng: random.Random, max_steps: int) -> dict[str, Any]:  # fmt: skip
    result = await client.reset(task)
    rewards, steps = 0.0, 0
    for number in range(max_steps):
        if policy == "expert":
            if number >= len(plan):
                break
            action = plan[number]
        else:
            listed = result.get("info", {}).get("available_actions")
            action = rng.choice(listed if listed else pool)
        result = await client.step(result["state"], action)
        rewards += float(result["reward"])
        steps += 1
        if result["done"]:
            break
    if callable(getattr(registry.make(client.env_id), "close", None)):
        await client.close(result["state"])
    judge = getattr(registry.make(client.env_id), "is_success", None)  # optional in the contract
    info = result.get("info", {})
    success = judge(result["done"], float(result["reward"]), info) if callable(judge) else (
        bool(result["done"]) and float(result["reward"]) > 0
    )  # fmt: skip
    return {"task": task, "done": bool(result["done"]), "success": success, "reward": float(result["reward"]),
            "steps": steps, "score": info.get("score")}  # fmt: skip


async def play(url: str, env_id: str, tasks: list[int], seed: int = 0, max_steps: int = 30,
               concurrency: int = 8) -> dict[str, dict[str, Any]]:  # fmt: skip
    """``{"expert": summary, "random": summary}`` over ``tasks``. Success is the core's ``is_success(done,
    reward, info)`` where it has one (SciWorld: a score of 100), else an episode that ended done with a positive
    last reward (TextCraft's craft of the goal, BabyAI's success above 0.5)."""
    env = registry.make(env_id)
    plans = {task: list(env.expert(task) or []) for task in tasks}
    pool = _action_pool(env_id, [t + 1 for t in tasks])
    out: dict[str, dict[str, Any]] = {}
    async with EnvClient(url, env_id, timeout=120) as client:
        semaphore = asyncio.Semaphore(concurrency)
        for policy in ("expert", "random"):
            rng = random.Random(seed)

            async def one(task: int, policy: str = policy, rng: random.Random = rng) -> dict[str, Any]:
                async with semaphore:
                    return await _episode(client, task, policy, plans[task], pool, rng, max_steps)

            episodes = await asyncio.gather(*(one(task) for task in tasks))
            out[policy] = {
                "episodes": len(episodes),
                "success_rate": sum(e["success"] for e in episodes) / max(1, len(episodes)),
                "mean_final_reward": sum(e["reward"] for e in episodes) / max(1, len(episodes)),
                "mean_steps": sum(e["steps"] for e in episodes) / max(1, len(episodes)),
            }
    return out
