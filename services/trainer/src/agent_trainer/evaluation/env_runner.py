"""``agent-train eval --env NAME``: the evaluation of any served environment, and of a mix of them.

One environment other than WebShop (TextCraft, BabyAI, SciWorld) is played through the balancer with its
trainer-side spec (``agent_trainer.envs``), as the agent loop plays it in training: the spec's system prompt and
first user turn, its parser on every reply (the expert's and the random policy's actions too, sent as an
``Action: ...`` reply), its outcome (reward, end, success, validity) and its next user turn; each turn's score
is the agent loop's ``TurnScore`` and the episode's figures come from ``reward.episode_summary``, so eval counts
steps and invalid actions as the training metrics do. The tasks are the environment's split of
``agent_trainer.env_data.split_tasks`` (the same split as the training data: test never shares a task with
train), the first ``--max-samples`` of it; the round budget is the spec's (AgentGym-RL's, what training allows)
unless ``--max-steps`` says otherwise.

The outputs are WebShop's (``runner``): ``trajectories.jsonl`` (one record per episode, every turn as the model
saw it), ``metrics.json`` (``metrics.summarize``), ``report.html``, ``eval_config.json``; resumable the same way.

A mix (``--env textcraft,babyai,webshop``) evaluates each environment into ``OUT/<env>/`` (WebShop's with the
WebShop runner, unchanged) with one policy (an LLM server starts once), then writes ``OUT/metrics.json``
(``metrics.summarize_mix`` and each environment's summary) and ``OUT/report.html`` (a table per environment, its
charts, and one episode browser over every environment's episodes).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from webshop_env.client import EnvClient, WebShopError, WebShopRequestError

from .. import envs, episode
from ..config import InteractionSettings
from ..episode import Episode, TurnScore
from ..reward import episode_summary
from .budget import training_budget
from .metrics import summarize, summarize_mix
from .policies import (
    ContextLengthExceeded,
    EnvRandomPolicy,
    ExpertPolicy,
    OpenAIPolicy,
    Policy,
    Turn,
    as_agentgym_reply,
)
from .runner import (
    METRICS,
    REPORT,
    TRAJECTORIES,
    EvalConfig,
    EvalError,
    EvalResult,
    PolicySpec,
    ResponseBudget,
    _jsonable,
    _key,
    _prepare_out_dir,
    _Runner,
    build_policy,
    evaluate_async,
    response_cap,
    use_budget,
)

#: ``--split`` (WebShop's names) -> the split of ``env_data`` (train, val, test).
SPLIT_OF = {"test": "test", "eval": "val", "train": "train"}
#: Expert plans of this many training tasks make the random policy's action pool (environments that list none).
POOL_TASKS = 20


def env_tasks(
    env_id: str, split: str, max_samples: int | None, only: Sequence[int] | None = None
) -> list[int]:
    """The tasks ``--split`` names for ``env_id`` (``env_data``'s split), the first ``max_samples`` of them;
    ``only`` (``--tasks``): exactly those tasks of the split, in the split's order (``make learn`` judges on the
    held-out tasks its expert solves)."""
    from ..data import DataError
    from ..env_data import split_tasks

    if split not in SPLIT_OF:
        raise EvalError(f"unknown split {split!r}; expected one of {', '.join(SPLIT_OF)}")
    try:
        tasks = split_tasks(env_id, SPLIT_OF[split])
    except DataError as error:
        raise EvalError(str(error)) from None
    if only is not None:
        outside = sorted(set(only) - set(tasks))
        if outside:
            raise EvalError(f"--tasks {outside[:5]} are not in the {split} split of {env_id}")
        tasks = [task for task in tasks if task in set(only)]
    return tasks[: max(0, max_samples)] if max_samples is not None else tasks


def instruction_of(opening: str) -> str:
    """The line of the first user turn that states the goal (the dataset rows' ``instruction``)."""
    from ..env_data import _instruction  # one rule for the data and for eval

    return _instruction(opening)


PlanOf = Callable[[int], Awaitable[list[str]]]


def plan_source(env: envs.EnvSpec, client: EnvClient, fingerprint: str | None) -> tuple[PlanOf, str]:
    """Where expert plans come from: the environment's core in this process when it is installed here and has
    the served data (the fingerprints match; as WebShop's ``--catalog``: no load on the service, and BabyAI's
    planner is slow), else the service's ``/<env>/v1/tasks/<task>/expert``."""
    if not env.holds_simulator:  # SciWorld's planner needs a simulator (a JVM): the service's
        try:
            from webshop_env.envs import registry

            core = registry.make(env.env_id)
            if f"{env.env_id}:{core.fingerprint()}" == fingerprint:  # the service's form (routes_envs)

                async def local(task: int) -> list[str]:
                    return list(await asyncio.to_thread(core.expert, task) or [])

                return local, "in-process"
        except Exception:  # not installed here, or other data: the service plans
            pass
    return (lambda task: expert_plan(client, task)), "server"


def build_env_policy(spec: PolicySpec, env: envs.EnvSpec, client: EnvClient, out: Path,
                     fingerprint: str | None = None) -> Policy:  # fmt: skip
    """The ``Policy`` of ``spec`` for ``env``: the expert plays the environment's expert plan, the random policy
    the environment's listed actions (else actions of training tasks' plans); the LLM policies are WebShop's with
    the environment's spec."""
    plans, source = plan_source(env, client, fingerprint) if spec.name in ("expert", "random") else (None, "")
    if spec.name == "expert":
        assert plans is not None
        return ExpertPolicy(lambda task, _: plans(task), source=source, reply=as_agentgym_reply)
    if spec.name == "random":
        assert plans is not None

        async def pool() -> list[str]:
            actions: list[str] = []
            for task in env_tasks(env.env_id, "train", POOL_TASKS):
                actions.extend(await plans(task))
            return actions

        return EnvRandomPolicy(pool, seed=spec.seed)
    policy = build_policy(spec, client, None, out)
    if isinstance(policy, OpenAIPolicy):
        policy.env_spec = env
    return policy


async def expert_plan(client: EnvClient, task: int) -> list[str]:
    """The service's expert plan of ``task``; empty where it has none (BabyAI's bot fails on a few levels): the
    expert then gives up at once and the episode scores 0, as WebShop's expert does without a way to the product."""
    try:
        return list(await client.expert(task))
    except WebShopRequestError as error:
        if error.status == 404:
            return []
        raise


async def evaluate_env_async(config: EvalConfig, spec: PolicySpec, env_id: str, policy: Policy | None = None
                             ) -> EvalResult:  # fmt: skip
    """Run (or resume) the evaluation of ``env_id`` (not WebShop) into ``config.out``; ``policy``: one already
    started by the caller (a mix), used as it is and left open."""
    env = envs.get(env_id)
    if env_id == envs.WEBSHOP:
        raise EvalError("WebShop's evaluation is runner.evaluate_async")
    if config.max_turns < 1 or config.concurrency < 1:
        raise EvalError("--max-steps and --concurrency must be at least 1")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tasks = env_tasks(env_id, config.split, config.max_samples, config.tasks)
    if not tasks:
        raise EvalError(f"the {config.split} split of {env_id} is empty")
    client = EnvClient(config.url, env_id, timeout=max(config.env_timeout, 60.0),
                       retry_budget=config.env_retry_budget_s, max_connections=max(16, 2 * config.concurrency))  # fmt: skip
    owned = policy is None
    try:
        try:
            await client.wait_until_ready(config.ready_timeout)
            info = await client.info()
        except WebShopRequestError as error:
            raise EvalError(
                f"the service at {config.url} does not serve {env_id} ({error}); start it with ENVS=...,{env_id} "
                "(make up-local / docker compose: WEBSHOP_ENVS)"
            ) from error
        except WebShopError as error:
            raise EvalError(str(error)) from error
        if tasks[-1] >= int(info.get("tasks", 0)):
            raise EvalError(
                f"{env_id} on {config.url} has {info.get('tasks')} tasks; the split needs {tasks[-1] + 1}"
            )
        if policy is None:
            policy = build_env_policy(spec, env, client, out, info.get("fingerprint"))
        elif isinstance(policy, OpenAIPolicy):
            policy.env_spec = env
        use_budget(policy, spec, env_id)
        identity = {"env": env_id, "policy": _identity_of(policy), "split": config.split,
                    "max_turns": config.max_turns, "env_fingerprint": info.get("fingerprint")}  # fmt: skip
        done = {
            k: r
            for k, r in _prepare_out_dir(out, identity, config.overwrite).items()
            if r["goal"] in set(tasks)
        }
        todo = [task for task in tasks if _key(None, task) not in done]  # type: ignore[arg-type]
        runner = EnvRunner(config, client, policy, env, spec.max_observation_chars)
        failures: list[dict[str, Any]] = []
        if todo:
            if owned:
                await policy.start()
            try:
                failures = await runner.run(todo, out / TRAJECTORIES, already=len(done), total=len(tasks))
            finally:
                if owned:
                    await policy.close()
        records = {**done, **{_key(None, r["goal"]): r for r in runner.finished}}  # type: ignore[arg-type]
    finally:
        await client.aclose()
    ordered = sorted(records.values(), key=lambda r: r["goal"])
    not_run = len(tasks) - len(ordered) - len(failures)
    metrics = summarize(ordered, bootstrap_seed=spec.seed)
    metrics.update(
        env=env_id,
        env_title=env.title,
        reward_rule=env.reward_rule,
        success_rule=env.success_rule,
        complete=not failures and not_run == 0,
        requested_episodes=len(tasks),
        resumed_episodes=len(done),
        failed_episodes=failures,
        not_run=not_run,
        policy=policy.describe(),
        seeds={"seed": spec.seed, "random_policy": f"Random('{spec.seed}:{env_id}:<task>')",
               "sampling": spec.seed if spec.name in ("openai", "checkpoint") else None, "bootstrap": spec.seed},
        config={**_jsonable(asdict(config)), "env": env_id, "goal_set": None, "tasks": [tasks[0], tasks[-1]],
                "task_split": f"agent_trainer.env_data.split_tasks({env_id!r}, {SPLIT_OF[config.split]!r})"},
        env_service={k: info.get(k) for k in ("env", "tasks", "fingerprint") if k in info},
        wall_s=round(time.monotonic() - started, 3),
        created_unix=int(time.time()),
    )  # fmt: skip
    (out / METRICS).write_text(json.dumps(metrics, indent=2) + "\n")
    if config.write_report:
        from .report_html import write_report

        write_report(out / REPORT, metrics, ordered)
    return EvalResult(metrics=metrics, out=out, complete=bool(metrics["complete"]), failures=failures)


def _identity_of(policy: Policy) -> dict[str, Any]:
    from .runner import _identity

    described = dict(policy.describe())
    described.pop("pool_size", None)  # known once the policy started
    return _identity(described)


class EnvRunner(_Runner):
    """WebShop's runner (concurrency, failures, progress, resumable output) with an episode of ``env``."""

    def __init__(self, config: EvalConfig, client: EnvClient, policy: Policy, env: envs.EnvSpec,
                 max_observation_chars: int = 0) -> None:  # fmt: skip
        super().__init__(config, client, policy, None, None)  # type: ignore[arg-type]
        self.env = env
        self.max_observation_chars = max_observation_chars

    async def episode(self, goal: int) -> dict[str, Any]:
        """Play task ``goal`` as the agent loop would; the record for ``trajectories.jsonl``."""
        env, client = self.env, self.client
        started = time.monotonic()
        first = await client.reset(goal)
        opening = env.first_message(first)
        instruction = instruction_of(opening)
        info = first.get("info") or {}
        turn = Turn(goal, env.env_id, instruction, opening, _listed(first), 0)
        agent = await self.policy.begin(turn)
        steps: list[dict[str, Any]] = []
        scores: list[TurnScore] = []
        ended_by, note, unparsed = "max_turns", "", 0
        usage: dict[str, int] = {}
        spent = ResponseBudget(response_cap(self.config, env.env_id))
        # one reply, one turn: the very code the agent loop and the 0.7.1 interaction play it with (episode.py);
        # eval pays no invalid-reply penalty and ends an episode the server refuses, as training's defaults do
        played = Episode(state=first["state"], goal=goal, goal_set=None, split=self.config.split)
        settings = InteractionSettings(
            invalid_action_penalty=0.0,
            max_observation_chars=self.max_observation_chars,
            on_env_error="terminate",
        )
        try:
            for index in range(self.config.max_turns):
                try:
                    decision = await agent.act(turn)
                except ContextLengthExceeded as error:
                    ended_by, note = "context_length", str(error)
                    break
                for name, value in decision.usage.items():
                    usage[name] = usage.get(name, 0) + value
                if decision.stop:
                    ended_by = "policy_stopped"
                    break
                if spent.exceeded(decision.usage):
                    ended_by, note = "response_budget", spent.note()
                    break
                played_turn = await episode.play_turn(env, settings, client, played, decision.output)
                scores.append(played_turn.score)
                unparsed += not played_turn.parsed.well_formed
                if played_turn.error is not None:
                    ended_by, note = "env_error", str(played_turn.error)
                    break
                parsed, outcome, result = played_turn.parsed, played_turn.outcome, played_turn.result
                steps.append({"observation": turn.observation, "available_actions": turn.available_actions,
                              "output": decision.output, "action": parsed.action, "reward": outcome.env_reward,
                              "done": outcome.done, "valid": outcome.valid, "well_formed": parsed.well_formed})  # fmt: skip
                if outcome.done:
                    ended_by = "done"
                    break
                message = episode.next_message(env, played_turn, settings)
                turn = Turn(
                    goal, env.env_id, instruction, message, _listed(result) if result else {}, index + 1
                )
                agent.observe(turn, decision, outcome.valid)
        finally:
            if env.holds_simulator:
                await episode.close_quietly(client, played.state)  # the server reaps idle episodes anyway
        summary = episode_summary(scores)
        record: dict[str, Any] = {
            "env": env.env_id,
            "task": goal,
            "goal": goal,
            "goal_set": None,
            "split": self.config.split,
            "category": _category(info, env.env_id),
            "instruction": instruction,
            "policy": self.policy.name,
            "reward": float(summary["env_reward"]),
            "score": float(summary["score"]),
            "success": bool(summary["success"]),
            "steps": len(steps),
            "invalid_actions": int(summary["invalid_actions"]),
            "unparsed_outputs": unparsed,
            "truncated": ended_by in ("max_turns", "response_budget"),
            "ended_by": ended_by,
            "reward_info": None,
            "elapsed_s": round(time.monotonic() - started, 4),
        }
        if usage:
            record["usage"] = usage
        if note:
            record["note"] = note
        record["turns"] = steps
        return record


def _listed(result: Mapping[str, Any]) -> dict[str, Any]:
    """The actions the environment lists on this step (BabyAI's ``available_actions``), for the random policy."""
    listed = (result.get("info") or {}).get("available_actions")
    return {"actions": list(listed)} if listed else {}


# ---- one environment or several -------------------------------------------------------------------------------
async def evaluate_envs_async(config: EvalConfig, spec: PolicySpec, env_ids: Sequence[str]) -> EvalResult:
    """``--env``: one environment into ``config.out``; several into ``config.out/<env>`` plus the mix's
    ``metrics.json`` and ``report.html`` (see the module docstring)."""
    env_ids = list(env_ids)
    if len(env_ids) == 1:
        if env_ids[0] == envs.WEBSHOP:
            return await evaluate_async(config, spec)
        return await evaluate_env_async(config, spec, env_ids[0])
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    shared: Policy | None = None
    if spec.name in ("openai", "checkpoint"):  # one model server for every environment
        shared = build_policy(spec, None, None, out)  # type: ignore[arg-type]
        await shared.start()
    results: dict[str, EvalResult] = {}
    try:
        for env_id in env_ids:
            sub = replace(config, out=out / env_id, max_turns=_rounds(config, env_id))
            if env_id == envs.WEBSHOP:
                if isinstance(shared, OpenAIPolicy):
                    shared.env_spec = None
                results[env_id] = await evaluate_async(sub, spec, policy=shared)
            else:
                results[env_id] = await evaluate_env_async(sub, spec, env_id, policy=shared)
    finally:
        if shared is not None:
            await shared.close()
    return write_mix(out, results, config.write_report)


def _rounds(config: EvalConfig, env_id: str) -> int:
    """The round budget of ``env_id`` in a mix: ``config.max_turns`` when it was given (``explicit_turns``), else
    the environment's own (its spec's rounds; WebShop's ``TRAINING_ENV_STEPS``)."""
    if config.explicit_turns:
        return config.max_turns
    return default_rounds(env_id)


def default_rounds(env_id: str) -> int:
    """Rounds per episode training allows ``env_id`` (its test config's; WebShop: verl's turn limit less one)."""
    return training_budget(env_id).rounds


def write_mix(out: Path, results: Mapping[str, EvalResult], write_report: bool = True) -> EvalResult:
    """The mix's ``metrics.json`` (``summarize_mix`` plus each environment's summary) and ``report.html``."""
    per_env = {env_id: r.metrics for env_id, r in results.items()}
    metrics: dict[str, Any] = {**summarize_mix(per_env), "complete": all(r.complete for r in results.values()),
                               "dirs": {env_id: env_id for env_id in results}, "created_unix": int(time.time()),
                               "policy": next(iter(per_env.values())).get("policy")}  # fmt: skip
    (out / METRICS).write_text(json.dumps(metrics, indent=2) + "\n")
    if write_report:
        from .report_html import load_records, write_mix_report

        records = {env_id: load_records(r.out / TRAJECTORIES) for env_id, r in results.items()}
        write_mix_report(out / REPORT, metrics, per_env, records)
    failures = [f | {"env": env_id} for env_id, r in results.items() for f in r.failures]
    return EvalResult(metrics=metrics, out=out, complete=bool(metrics["complete"]), failures=failures)


def _category(info: Mapping[str, Any], env_id: str) -> str:
    """An episode's group in the report: BabyAI's level (``GoToRedBall`` of ``BabyAI-GoToRedBall-v0``), else the
    environment's id."""
    level = str(info.get("level") or "")
    return level.removeprefix("BabyAI-").removesuffix("-v0") if level else env_id
