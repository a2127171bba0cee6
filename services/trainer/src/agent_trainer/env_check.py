"""``agent-train env-check``: can every node's trainer processes play every served environment, the way training will?

One Ray task per node of the running cluster (pinned there, with the run's ``AGENTRL_*`` settings in its
runtime environment, as the launcher gives verl's workers) opens the trainer's own clients
(``interaction.shared_client``: with ``AGENTRL_ENV=ray`` its node's Serve proxy first; WebShop's ``/v1``, the
other environments' native ``/<env>/v1``) and plays expert episodes of each environment, each through its own
client: the expert's actions for a task (WebShop's goals in the run's goal set, which its reset takes too), each
episode to its end (``done``) or to the expert's last action; a task the environment has no expert for is
skipped. The environments are those the run serves (``--envs``, else ``$AGENTRL_ENVS``, else what the service
serves by default): a node that cannot reach one of them fails here, in seconds or minutes, not at a training
step an hour in.

The report says, per node and environment, which address served each episode, its reward, whether it ended and,
for an environment that holds a simulator per episode (SciWorld), the node's simulator counts afterwards (a replay
there means an episode's steps left the replica holding its JVM). Run it after ``agent-envs serve-ray`` and
before a long run (the Slurm script does).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

#: Seconds per HTTP attempt where an environment starts a simulator per episode (SciWorld: a JVM start and a task
#: load, 3-25 s on a loaded node for the expert's gold path); the trainer's default (10 s) elsewhere.
SIMULATOR_TIMEOUT_S = 120.0
#: Tasks tried per episode asked for, where an environment has no expert for some (BabyAI: 2 of the first 16).
TRIES_PER_EPISODE = 4


def served_envs(env: Mapping[str, str], envs: str | Sequence[str] | None = None) -> list[str]:
    """The environments to play: ``envs`` (a comma-separated string or a list), else ``$AGENTRL_ENVS`` (what
    ``agent-envs serve-ray`` serves), else what the service serves when that names none (its default, WebShop:
    ``agent_envs.deploy.parse_envs``); in that order, each once. Raises ``ValueError`` naming an environment the
    trainer does not know."""
    from agent_envs.deploy import parse_envs

    from . import envs as specs

    given = envs if envs is not None else (env.get("AGENTRL_ENVS") or parse_envs(None))
    names = [n.strip() for n in (given.split(",") if isinstance(given, str) else given) if n.strip()]
    unknown = [n for n in names if n not in specs.ids()]
    if unknown:
        raise ValueError(
            f"unknown environment(s) {', '.join(unknown)}: the trainer knows {', '.join(specs.ids())}"
        )
    return list(dict.fromkeys(names)) or parse_envs(None)


def _settings(env_id: str) -> Any:
    from . import envs as specs
    from .config import InteractionSettings

    slow = specs.get(env_id).holds_simulator
    return InteractionSettings(ready_timeout=60.0, **({"timeout": SIMULATOR_TIMEOUT_S} if slow else {}))


async def _play_env(env_id: str, episodes: int, goal_set: str, first: int) -> dict[str, Any]:
    """Up to ``episodes`` expert episodes of ``env_id`` from task ``first`` on (a task without an expert skipped,
    at most :data:`TRIES_PER_EPISODE` tasks tried per episode). The goal set goes to the expert and the reset
    where the environment's reset takes one (its spec's ``reset_fields``: WebShop's goals are indices in it)."""
    from agent_envs.client import ServiceRequestError

    from . import envs as specs
    from .interaction import ensure_ready, shared_client

    spec = specs.get(env_id)
    settings = _settings(env_id)
    client = shared_client(settings, env_id)
    await ensure_ready(settings, client)
    in_goal_set = {"goal_set": goal_set} if "goal_set" in spec.reset_fields else {}
    tasks = (await client.info()).get("tasks")  # None: no pool to wrap around (WebShop's goals)
    played: list[dict[str, Any]] = []
    for k in range(TRIES_PER_EPISODE * episodes):
        if len(played) >= episodes:
            break
        task = first + k if tasks is None else (first + k) % int(tasks)
        try:
            actions = await client.expert(task, **in_goal_set)
        except ServiceRequestError as error:
            if error.error == "no_expert":  # e.g. a BabyAI level the bot cannot solve from this seed
                continue
            raise
        # a task the expert finds no way to (WebShop's answer: no actions) is not one to check with
        if actions:
            played.append(await _episode(client, actions, task, in_goal_set))
    result: dict[str, Any] = {"urls": client.urls, "episodes": played}
    if spec.holds_simulator:  # the simulators of the replica that answers this node (its own)
        result["simulators"] = (await client.info()).get("simulators")
    return result


async def _episode(
    client: Any, actions: Sequence[str], task: int, reset_options: Mapping[str, Any]
) -> dict[str, Any]:
    """One expert episode: reset (with ``reset_options``, the goal set where the environment takes one), then the
    expert's actions until the episode ends (a gold path may run past it)."""
    step = await client.reset(task, **reset_options)
    served_by = client.url
    state, reward, done, steps = step["state"], 0.0, bool(step.get("done")), 0
    for action in actions:
        if done:
            break
        step = await client.step(state, action)
        state, reward, done, steps = step["state"], float(step["reward"]), bool(step.get("done")), steps + 1
    episode = {"task": task, "reward": reward, "done": done, "steps": steps, "url": served_by}
    info = step.get("info") or {}
    if "score" in info:  # SciWorld: the episode's score (its step rewards are the changes)
        episode["score"] = info["score"]
    return episode


async def _play(envs: Sequence[str], episodes: int, goal_set: str, first: int) -> dict[str, Any]:
    """Every environment of ``envs`` through this process's clients; an environment that fails is reported with its
    error, and the others are still played."""
    from .interaction import close_shared_clients

    played: dict[str, Any] = {}
    try:
        for env_id in envs:
            try:
                played[env_id] = await _play_env(env_id, episodes, goal_set, first)
            except Exception as error:  # this environment cannot be played from here: say which and why
                played[env_id] = {"error": f"{type(error).__name__}: {error}"}
    finally:
        await close_shared_clients()
    return played


def _node_episodes(envs: Sequence[str], episodes: int, goal_set: str, first: int) -> dict[str, Any]:
    import ray

    played = asyncio.run(_play(envs, episodes, goal_set, first))
    return {
        "node_ip": ray.util.get_node_ip_address(),
        "env": os.environ.get("AGENTRL_ENV", "http"),
        "envs": played,
    }


def node_ok(node: Mapping[str, Any], envs: Sequence[str], episodes: int) -> bool:
    """Whether a node played ``episodes`` episodes of every environment of ``envs``."""
    played = node.get("envs") or {}
    return "error" not in node and all(
        "error" not in played.get(e, {"error": "not played"}) and len(played[e]["episodes"]) == episodes
        for e in envs
    )


def run_env_check(env: Mapping[str, str], episodes: int = 8, goal_set: str = "synthetic",
                  envs: str | Sequence[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Play ``episodes`` expert episodes of every served environment (:func:`served_envs`) from every alive node;
    returns the report (``ok`` says if all did; ``error`` says why no node was asked, e.g. the head does not
    answer, or an unknown environment)."""
    try:
        names = served_envs(env, envs)
    except ValueError as error:
        return {"ok": False, "error": str(error), "envs": [], "nodes": []}
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from agent_envs.ray_serve.attach import AttachError, attach, attach_timeout
    from agent_envs.ray_serve.deploy import use_cluster_token

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
        return {"ok": False, "error": str(error), "envs": names, "nodes": []}
    try:
        nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeManagerAddress"])
        task = ray.remote(num_cpus=0, max_retries=0)(_node_episodes)
        refs = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(names, episodes, goal_set, index * episodes)
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
    ok = bool(reports) and all(node_ok(r, names, episodes) for r in reports)
    return {"ok": ok, "envs": names, "nodes": reports}


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The report in words, a line per node and environment (what ``agent-train env-check`` prints to stderr)."""
    lines = [f"error: {report['error']}"] if report.get("error") else []
    for node in report.get("nodes", []):
        if "error" in node:
            lines.append(f"node {node['node_ip']}: {node['error']}")
            continue
        for env_id, played in node.get("envs", {}).items():
            if "error" in played:
                lines.append(f"node {node['node_ip']}: {env_id}: {played['error']}")
                continue
            rewards = [e["reward"] for e in played["episodes"]]
            ended = sum(1 for e in played["episodes"] if e["done"])
            line = (f"node {node['node_ip']}: {env_id}: {len(rewards)} episode(s) through {played['urls'][0]}, "
                    f"{ended} ended, mean reward {sum(rewards) / max(1, len(rewards)):.3f}")  # fmt: skip
            if played.get("simulators"):
                line += f", simulators {played['simulators']}"
            lines.append(line)
    return lines
