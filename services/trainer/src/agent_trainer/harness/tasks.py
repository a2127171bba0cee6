"""The tasks a CPU run plays with a scripted oracle: ones whose expert plan fits the run's turns and is known to
succeed, so a trajectory that does not earn its reward points at the path under test, not at the task."""

from __future__ import annotations

from pathlib import Path

from .errors import HarnessError


def pick_oracle_goals(
    catalog_dir: Path, goal_set: str, split: str, count: int, max_turns: int, scan: int | None = None
) -> dict[int, list[str]]:
    """``count`` goals of the split whose oracle plan fits the env steps ``max_turns`` assistant turns allow
    (``max_turns - 1``, see :mod:`agent_trainer.turns`), that replay to reward 1.0 in-process, and whose
    instruction is unique among the picked ones (the scripted policy finds its plan by instruction).

    The goals are spread over every plan length found among the first ``scan`` goals, longest first, so a run
    with as many goals as lengths has one goal at the step limit itself.
    """
    from agent_envs.envs.webshop.catalog.store import open_catalog
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.goals import split_range
    from agent_envs.envs.webshop.core.oracle import expert_actions, run_actions

    from ..turns import env_steps_for_turns

    step_limit = env_steps_for_turns(max_turns)
    catalog = open_catalog(catalog_dir)
    env = WebShopEnv(catalog)
    by_length: dict[int, list[tuple[int, list[str]]]] = {}
    instructions: set[str] = set()
    scanned = 0
    for goal in split_range(split, catalog.goal_count(goal_set)):
        if scanned >= (scan or max(200, 25 * count)) and sum(len(v) for v in by_length.values()) >= count:
            break
        scanned += 1
        plan = expert_actions(env, goal, goal_set=goal_set)
        if not plan or len(plan) > step_limit or len(by_length.get(len(plan), [])) >= count:
            continue
        steps = run_actions(env, goal, plan, goal_set=goal_set)
        instruction = steps[0].instruction
        if steps[-1].reward != 1.0 or instruction in instructions:
            continue
        by_length.setdefault(len(plan), []).append((goal, plan))
        instructions.add(instruction)
    picked: dict[int, list[str]] = {}
    queues = [list(by_length[length]) for length in sorted(by_length, reverse=True)]
    while len(picked) < count and any(queues):
        for queue in queues:
            if queue and len(picked) < count:
                goal, plan = queue.pop(0)
                picked[goal] = plan
    if len(picked) < count:
        raise HarnessError(
            f"found only {len(picked)} {split} goals of the {goal_set} set that the oracle solves in {step_limit} "
            f"env steps ({max_turns} assistant turns)"
        )
    return picked


def pick_env_tasks(env_id: str, count: int, max_rounds: int | None = None, env_url: str | None = None
                   ) -> dict[int, list[str]]:  # fmt: skip
    """``count`` training tasks of ``env_id`` whose expert plan fits ``max_rounds`` (default: the spec's rounds) and
    replays to success through the spec (``envs.replay``: the parser, the outcome), with distinct first user turns
    (the scripted policy finds its plan by them), spread over the split. The core is this process's where the
    environment's package is installed, else the service's at ``env_url`` (the trainer images have no
    environment extras: ``agent_envs.client.served``)."""
    from agent_envs.client.served import core_or_served

    from .. import envs
    from ..env_data import split_tasks
    from ..envs.replay import replay_score
    from ..evaluation.policies import as_agentgym_reply

    spec = envs.get(env_id)
    core, _ = core_or_served(env_id, env_url)
    train = split_tasks(env_id, "train")
    stride = max(1, len(train) // max(1, 8 * count))
    picked: dict[int, list[str]] = {}
    openings: set[str] = set()
    for task in train[::stride]:
        if len(picked) >= count:
            break
        plan = list(core.expert(task) or [])
        if not plan or len(plan) > (max_rounds or spec.max_rounds):
            continue
        if replay_score(env_id, task, [as_agentgym_reply(a) for a in plan], core=core)["success"] != 1.0:
            continue
        first = core.reset(task)
        opening = spec.first_message({"observation": first.observation, "info": dict(first.info)})
        if opening in openings:
            continue
        openings.add(opening)
        picked[task] = plan
    if len(picked) < count:
        raise HarnessError(f"found only {len(picked)} {env_id} training tasks whose expert plan succeeds")
    return picked
