"""``agent-train env-check``: can every node's trainer processes play episodes, the way training will?

One Ray task per node of the running cluster (pinned there, with the run's ``WEBSHOP_*`` settings in its
runtime environment, as the launcher gives verl's workers) opens the trainer's own client
(``interaction.shared_client``: with ``WEBSHOP_ENV=ray`` its node's Serve proxy first) and plays expert
episodes (the server's ``/v1/goals/<goal>/expert`` actions). The report says, per node, which address served,
how many episodes completed and their rewards. Run it after ``webshop-env serve-ray`` and before a long run
(the Slurm script does): a node whose processes cannot reach the env fails here in seconds, not at step 1.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any


async def _play(episodes: int, goal_set: str, first_goal: int) -> dict[str, Any]:
    from .config import InteractionSettings
    from .interaction import close_shared_clients, ensure_ready, shared_client

    settings = InteractionSettings(ready_timeout=60.0)
    client = shared_client(settings)
    played: list[list[Any]] = []
    try:
        await ensure_ready(settings, client)
        for goal in range(first_goal, first_goal + episodes):
            actions = await client.expert(goal, goal_set)
            step = await client.reset(goal, goal_set=goal_set)
            served_by = client.url
            state, reward = step["state"], 0.0
            for action in actions:
                step = await client.step(state, action)
                state, reward = step["state"], step["reward"]
            played.append([goal, reward, served_by])
    finally:
        await close_shared_clients()
    return {"urls": client.urls, "episodes": played}


def _node_episodes(episodes: int, goal_set: str, first_goal: int) -> dict[str, Any]:
    import ray

    result = asyncio.run(_play(episodes, goal_set, first_goal))
    return {"node_ip": ray.util.get_node_ip_address(), "env": os.environ.get("WEBSHOP_ENV", "http"), **result}


def run_env_check(env: Mapping[str, str], episodes: int = 8, goal_set: str = "synthetic") -> dict[str, Any]:
    """Play ``episodes`` expert episodes from every alive node; returns the report (``ok`` says if all did;
    ``error`` says why no node was asked, e.g. the head does not answer)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from webshop_env.ray_serve.attach import AttachError, attach, attach_timeout
    from webshop_env.ray_serve.deploy import use_cluster_token

    from .config import worker_env

    use_cluster_token()
    try:  # a dead head: a clear error within the attach timeout, not a hang
        attach(
            env.get("RAY_ADDRESS") or "auto",
            attach_timeout(env),
            runtime_env={"env_vars": worker_env(env)},
            log_to_driver=False,
            logging_level="WARNING",
        )
    except AttachError as error:
        return {"ok": False, "error": str(error), "nodes": []}
    try:
        nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeManagerAddress"])
        task = ray.remote(num_cpus=0, max_retries=0)(_node_episodes)
        refs = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(episodes, goal_set, index * episodes)
            for index, node in enumerate(nodes)
        ]
        reports = []
        for node, ref in zip(nodes, refs, strict=True):
            try:
                reports.append(ray.get(ref))
            except Exception as error:  # this node's processes cannot play: say which and why
                reports.append(
                    {"node_ip": node["NodeManagerAddress"], "error": f"{type(error).__name__}: {error}"}
                )
    finally:
        ray.shutdown()
    ok = bool(reports) and all("error" not in r and len(r["episodes"]) == episodes for r in reports)
    return {"ok": ok, "nodes": reports}
