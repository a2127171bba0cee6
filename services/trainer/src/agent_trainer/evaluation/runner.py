"""``agent-train eval``: run a policy on a split's tasks of one environment through the balancer, concurrently,
resumably; ``env_runner`` mixes several environments, each played here.

One path plays every environment (``evaluate_async``): the set-up (the service ready, the split's tasks, the
policy, the run's identity and resumption), the episode (the policy's replies under the round and response budgets,
each played on the environment, the record of every turn), the metrics and the report. What differs between
environments is how an episode is played, chosen by the spec's ``eval_protocol`` (``PLAYS``):

- ``SpecPlay`` (``"spec"``: TextCraft, BabyAI, SciWorld, Sokoban, plugins) plays the environment as the agent loop
  plays it in training: the spec's system prompt and first user turn, its parser on every reply (the expert's and
  the random policy's actions too, sent as an ``Action: ...`` reply), its outcome and its next user turn
  (``agent_trainer.episode.play_turn``), on the tasks of the training data's split
  (``agent_trainer.env_data.split_tasks``: test never shares a task with train);
- ``PagePlay`` (``"pages"``: WebShop) plays the service's own protocol: the split of a goal set the service serves,
  the page and its actions handed to the policy as they are (the chat policy builds the training prompt from them,
  ``conversation.Conversation``; the random policy clicks the page's labels), the expert's actions sent verbatim.

Outputs in ``--out``:
- ``trajectories.jsonl``: one JSON object per finished episode (goal, category, reward, ended_by, ...) with
  ``turns``: every step as the agent saw it (observation, available actions, model output, parsed action,
  reward, done, valid). Appended as episodes finish, so an interrupted run keeps its work;
- ``metrics.json``: ``metrics.summarize`` plus the run's identity (config, policy, seeds, catalog) and its
  completeness (``complete``, ``failed_episodes``, ``not_run``);
- ``report.html``: the self-contained report (``report_html``);
- ``eval_config.json``: what identifies the run; a rerun with the same ``--out`` resumes (finished episodes
  are skipped) only when it matches, and refuses otherwise (``--overwrite`` starts afresh).

Failure policy: an episode whose policy fails after its retries (``PolicyError``) is *not* scored; it is
listed in ``metrics.json`` and the run stops after ``max_policy_errors`` such failures (a dead endpoint would
fail them all), reporting ``complete: false``. An unreachable environment or a refused request aborts the run
with ``EvalError``; rerunning the same command resumes.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_envs.client import (
    EnvClient,
    ServiceError,
    ServiceRequestError,
    ServiceUnavailable,
    WebShopClient,
)
from agent_envs.envs.webshop.catalog.fidelity import fidelity_limits

from .. import envs, episode
from ..config import InteractionSettings, default_env_url, turn_tokens
from ..envs.webshop import is_success
from ..envs.webshop.actions import step_was_valid
from ..episode import Episode, TurnScore
from ..reward import episode_summary
from ..turns import TRAINING_ENV_STEPS
from .budget import training_budget
from .metrics import UNKNOWN_CATEGORY, solved, summarize
from .policies import (
    CheckpointPolicy,
    ContextLengthExceeded,
    Decision,
    EnvRandomPolicy,
    ExpertPolicy,
    OpenAIPolicy,
    Policy,
    PolicyError,
    RandomPolicy,
    Turn,
    as_agentgym_reply,
    catalog_plans,
)

DEFAULT_URL = default_env_url()  # $AGENTRL_URL, else the local balancer: the same default as training
TRAJECTORIES = "trajectories.jsonl"
METRICS = "metrics.json"
REPORT = "report.html"
RUN_CONFIG = "eval_config.json"
#: ``--split`` (WebShop's names) -> the split of ``env_data`` (train, val, test).
SPLIT_OF = {"test": "test", "eval": "val", "train": "train"}
#: Expert plans of this many training tasks make the random policy's action pool (environments that list none).
POOL_TASKS = 20


class EvalError(RuntimeError):
    """The evaluation cannot run or go on; the message says why and what to do."""


@dataclass
class PolicySpec:
    """Which policy to evaluate and its settings (what the CLI flags carry)."""

    name: str
    seed: int = 0
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    temperature: float = 0.1  # the guides' evaluation temperature
    top_p: float = 1.0
    max_tokens: int | None = (
        None  # new tokens per reply; None: each environment's training budget (budget.py)
    )
    request_timeout: float = 120.0
    retries: int = 5
    backoff: float = 0.5
    model_path: str | None = None
    server_port: int = 0
    server: str = "sglang"  # checkpoint: sglang, or cpu (the rehearsal's CPU chat server, for a tiny model)
    server_python: str | None = None
    server_args: list[str] = field(default_factory=list)
    startup_timeout: float = 900.0
    max_observation_chars: int = 0


@dataclass
class EvalConfig:
    """One evaluation run."""

    out: Path
    url: str = DEFAULT_URL
    split: str = "test"
    goal_set: str | None = None  # None: the server's default goal set
    max_samples: int | None = None  # None: the whole split
    tasks: tuple[int, ...] | None = None  # only these tasks of the split (other environments than WebShop)
    max_turns: int = (
        TRAINING_ENV_STEPS  # actions (env steps) per episode; training allows the same (turns.py)
    )
    concurrency: int = 32
    catalog: Path | None = None  # a local copy of the served catalog: categories and in-process expert plans
    max_policy_errors: int = 3
    overwrite: bool = False
    ready_timeout: float = 60.0
    env_timeout: float = 10.0
    env_retry_budget_s: float = 60.0
    progress: bool = True
    write_report: bool = True
    explicit_turns: bool = False  # max_turns was given (a mix then uses it for every environment)
    # every turn after the first together (replies and pages), in tokens, as verl's data.max_response_length: the
    # episode ends when a reply would pass it. None: each environment's training budget (budget.py); 0: no cap
    max_response_tokens: int | None = None


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    out: Path
    complete: bool
    failures: list[dict[str, Any]]

    @property
    def metrics_path(self) -> Path:
        return self.out / METRICS

    @property
    def report_path(self) -> Path:
        return self.out / REPORT


# ---- policy construction --------------------------------------------------------------------------------
def use_budget(policy: Policy, spec: PolicySpec, env_id: str) -> None:
    """Give a chat policy ``env_id``'s per-reply budget from training (``--max-tokens`` where it was given): one
    model server plays a mix's environments one after the other, each with its own."""
    if isinstance(policy, OpenAIPolicy):
        policy.max_tokens = spec.max_tokens or training_budget(env_id).turn_tokens


def response_cap(config: EvalConfig, env_id: str) -> int:
    """Tokens of every turn after the first together that an episode of ``env_id`` may spend (0: no cap)."""
    if config.max_response_tokens is not None:
        return config.max_response_tokens
    return training_budget(env_id).response_tokens


class ResponseBudget:
    """verl's response budget in eval: the model's replies and the env's pages after the first turn, counted from the
    model server's own token counts (a request's prompt tokens less the first request's, plus its new tokens).
    ``exceeded(usage)`` is true once a reply would go past it: training would have cut that reply and ended."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.first_prompt: int | None = None
        self.spent = 0

    def exceeded(self, usage: dict[str, int]) -> bool:
        if self.cap <= 0 or "prompt_tokens" not in usage:  # no cap, or a policy without token counts
            return False
        if self.first_prompt is None:
            self.first_prompt = usage["prompt_tokens"]
        self.spent = usage["prompt_tokens"] - self.first_prompt + usage.get("completion_tokens", 0)
        return self.spent > self.cap

    def note(self) -> str:
        return f"the response budget of {self.cap} tokens is spent ({self.spent}: training would have ended here)"


def build_policy(spec: PolicySpec, client: WebShopClient, catalog: Any | None, out: Path) -> Policy:
    """The ``Policy`` of ``spec``; the expert takes its plans from ``catalog`` when given, else the server."""
    if spec.name == "expert":
        if catalog is not None:
            return ExpertPolicy(catalog_plans(catalog), source="catalog")

        async def server_plans(goal: int, goal_set: str) -> list[str]:
            return await client.expert(goal, goal_set=goal_set)

        return ExpertPolicy(server_plans, source="server")
    if spec.name == "random":
        return RandomPolicy(seed=spec.seed)
    chat: dict[str, Any] = {
        "api_key": spec.api_key,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "max_tokens": spec.max_tokens or turn_tokens(),
        "timeout": spec.request_timeout,
        "retries": spec.retries,
        "backoff": spec.backoff,
        "seed": spec.seed,
        "max_observation_chars": spec.max_observation_chars,
    }
    if spec.name == "openai":
        return OpenAIPolicy(base_url=spec.base_url or "", model=spec.model or "", **chat)
    if spec.name == "checkpoint":
        if not spec.model_path:
            raise EvalError("the checkpoint policy needs --model-path (MODEL_PATH=... for `make eval`)")
        return CheckpointPolicy(
            spec.model_path,
            port=spec.server_port,
            python=spec.server_python,
            startup_timeout=spec.startup_timeout,
            server_args=spec.server_args,
            log_path=out / f"{spec.server}_server.log",
            server=spec.server,
            **chat,
        )
    raise EvalError(f"unknown policy {spec.name!r}; expected expert, random, openai or checkpoint")


# ---- the tasks and plans of a spec-played environment ------------------------------------------------------------
def env_tasks(
    env_id: str, split: str, max_samples: int | None, only: Sequence[int] | None = None
) -> list[int]:
    """The tasks ``--split`` names for ``env_id`` (``env_data``'s split), the first ``max_samples`` of them;
    ``only`` (``--tasks``): exactly those tasks of the split, in the split's order (``make learn`` judges on the
    held-out tasks its expert solves)."""
    from ..env_data import split_tasks
    from ..envs.webshop.data import DataError

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
            from agent_envs.envs import registry

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
    policy = build_policy(spec, client, None, out)  # type: ignore[arg-type]
    if isinstance(policy, OpenAIPolicy):
        policy.env_spec = env
    return policy


async def expert_plan(client: EnvClient, task: int) -> list[str]:
    """The service's expert plan of ``task``; empty where it has none (BabyAI's bot fails on a few levels): the
    expert then gives up at once and the episode scores 0, as WebShop's expert does without a way to the product."""
    try:
        return list(await client.expert(task))
    except ServiceRequestError as error:
        if error.status == 404:
            return []
        raise


# ---- how an environment is played ------------------------------------------------------------------------------
@dataclass
class Prepared:
    """What the set-up found: the run's tasks (in order), the goal set they belong to (WebShop's; None for a
    spec-played environment: then the records' ``goal_set`` and the resumption keys' are None), the service's
    ``info`` and a local catalog (WebShop's ``--catalog``)."""

    tasks: list[int]
    goal_set: str | None
    info: dict[str, Any]
    catalog: Any | None = None


@dataclass
class Step:
    """One reply played: the turn's entry in the record (None: nothing was played, the episode ends with
    ``ended_by`` and ``note``), whether the reply named an action and the environment took it, why the episode
    ended (None: it goes on) and the turn the policy sees next."""

    entry: dict[str, Any] | None
    well_formed: bool
    valid: bool
    ended_by: str | None = None
    note: str = ""
    next_turn: Turn | None = None


class EpisodePlay(ABC):
    """One episode of one task on the environment's protocol; the runner drives it (``_Runner.episode``)."""

    instruction: str = ""

    @abstractmethod
    async def start(self) -> Turn:
        """Reset the environment on the task; the first turn the policy sees."""

    @abstractmethod
    async def step(self, decision: Decision, turn: Turn) -> Step:
        """Play ``decision`` (the reply to ``turn``) on the environment."""

    @abstractmethod
    def labels(self) -> dict[str, Any]:
        """The record's fields ahead of ``goal`` (the environment and the task; none for WebShop's)."""

    @abstractmethod
    def category(self) -> str:
        """The episode's group in the metrics and the report."""

    @abstractmethod
    def result(self) -> dict[str, Any]:
        """The record's reward fields (``reward``, ``success`` and what the environment adds), by its rule."""

    def reward_info(self) -> Any:
        """The reward's breakdown where the environment gives one (WebShop's purchase)."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the episode holds on the service."""


class EnvPlay(ABC):
    """How eval plays one environment: its client, its set-up and its episodes (``EpisodePlay``)."""

    def __init__(self, env: envs.EnvSpec, max_observation_chars: int = 0) -> None:
        self.env = env
        #: the interaction setting of that name (``--max-observation-chars``): pages cut in later user turns
        self.max_observation_chars = max_observation_chars

    @abstractmethod
    def client(self, config: EvalConfig) -> Any:
        """The environment's client on ``config.url``."""

    @abstractmethod
    async def prepare(self, client: Any, config: EvalConfig) -> Prepared:
        """Wait for the service and find the run's tasks; ``EvalError`` says what is wrong."""

    @abstractmethod
    def build_policy(self, spec: PolicySpec, client: Any, prepared: Prepared, out: Path) -> Policy:
        """The policy of ``spec`` for this environment."""

    @abstractmethod
    def chat_spec(self) -> envs.EnvSpec | None:
        """The spec an LLM policy builds its chat from (None: WebShop's own ``Conversation``)."""

    @abstractmethod
    def identity(self, config: EvalConfig, prepared: Prepared, policy: dict[str, Any]) -> dict[str, Any]:
        """What identifies the run (``eval_config.json``): a resumed run must match it."""

    @abstractmethod
    def episode(self, client: Any, config: EvalConfig, prepared: Prepared, task: int) -> EpisodePlay:
        """The episode of ``task``."""

    def heading(self) -> dict[str, Any]:
        """The metrics' fields right after the summary (what the environment is and how it is judged)."""
        return {}

    @abstractmethod
    def random_policy_seed(self, seed: int) -> str:
        """How the random policy seeds each episode, in words (``metrics.json``'s ``seeds``)."""

    @abstractmethod
    def config_fields(self, config: EvalConfig, prepared: Prepared) -> dict[str, Any]:
        """The metrics' ``config`` besides ``EvalConfig``'s fields."""

    @abstractmethod
    def service(self, prepared: Prepared, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What the metrics say about the service's data (WebShop's catalog; another environment's tasks)."""


# ---- WebShop's protocol: goal sets, pages as they are ---------------------------------------------------------------
class PagePlay(EnvPlay):
    """WebShop's goal sets through its own routes (see the module docstring)."""

    def client(self, config: EvalConfig) -> WebShopClient:
        return WebShopClient(config.url, timeout=config.env_timeout, retry_budget=config.env_retry_budget_s,
                             max_connections=max(16, 2 * config.concurrency))  # fmt: skip

    async def prepare(self, client: WebShopClient, config: EvalConfig) -> Prepared:
        try:
            await client.wait_until_ready(config.ready_timeout)
            info = await client.info()
            summary = await client.goals(goal_set=config.goal_set, split=config.split)
        except ServiceRequestError as error:
            raise EvalError(f"the environment refused the run's set-up: {error}") from error
        except ServiceError as error:
            raise EvalError(str(error)) from error
        goal_set = config.goal_set or summary["default_goal_set"]
        if goal_set not in summary["goal_sets"]:
            raise EvalError(f"the server has no goal set {goal_set!r}: it has {', '.join(info['goal_sets'])}")
        split = summary["goal_sets"][goal_set]["splits"][config.split]
        goals = list(range(split["start"], split["stop"]))
        if config.max_samples is not None:
            goals = goals[: max(0, config.max_samples)]
        if not goals:
            raise EvalError(f"the {config.split} split of the {goal_set} goals is empty on this server")
        catalog = _open_catalog(config.catalog, info["fingerprint"]) if config.catalog else None
        return Prepared(goals, goal_set, info, catalog)

    def build_policy(self, spec: PolicySpec, client: WebShopClient, prepared: Prepared, out: Path) -> Policy:
        return build_policy(spec, client, prepared.catalog, out)

    def chat_spec(self) -> None:
        return None

    def identity(self, config: EvalConfig, prepared: Prepared, policy: dict[str, Any]) -> dict[str, Any]:
        return {"policy": policy, "split": config.split, "goal_set": prepared.goal_set,
                "max_turns": config.max_turns, "catalog_fingerprint": prepared.info["fingerprint"]}  # fmt: skip

    def episode(
        self, client: WebShopClient, config: EvalConfig, prepared: Prepared, task: int
    ) -> EpisodePlay:
        return _PageEpisode(client, config, prepared, task)

    def random_policy_seed(self, seed: int) -> str:
        return f"Random('{seed}:<goal_set>:<goal>')"

    def config_fields(self, config: EvalConfig, prepared: Prepared) -> dict[str, Any]:
        return {"goal_set": prepared.goal_set, "goals": [prepared.tasks[0], prepared.tasks[-1]]}

    def service(self, prepared: Prepared, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        info = prepared.info
        return {
            "catalog": {
                "fingerprint": info["fingerprint"],
                "products": info.get("products"),
                "version": info.get("version"),
                "categories_from": _category_source(records, prepared.catalog is not None),
                # the reward's definition on this catalog (noun extractor, seeded or pinned prices and ceilings)
                "fidelity": fidelity_limits(info.get("catalog") or {}),
            }
        }


class _PageEpisode(EpisodePlay):
    """A WebShop episode: the policy's action sent as it is (a reply without one: ``Decision.send``), the page
    and its actions shown as they are; the purchase pays."""

    def __init__(self, client: WebShopClient, config: EvalConfig, prepared: Prepared, goal: int) -> None:
        self.client, self.config, self.prepared, self.goal = client, config, prepared, goal
        self.state = ""
        self.first_info: dict[str, Any] = {}
        self.reward, self.final_info = 0.0, {}

    async def start(self) -> Turn:
        goal_set = self.prepared.goal_set
        first = await self.client.reset(self.goal, goal_set=goal_set, split=self.config.split)
        self.state, self.instruction, self.first_info = (
            first["state"],
            first["instruction"],
            first.get("info", {}),
        )
        return Turn(
            self.goal, goal_set, self.instruction, first["observation"], first["available_actions"], 0
        )  # type: ignore[arg-type]

    async def step(self, decision: Decision, turn: Turn) -> Step:
        result = await self.client.step(self.state, decision.env_action)
        self.state = result["state"]
        valid = step_was_valid(decision.action, result["info"])
        entry = {"observation": turn.observation, "available_actions": turn.available_actions,
                 "output": decision.output, "action": decision.action, "reward": float(result["reward"]),
                 "done": bool(result["done"]), "valid": valid}  # fmt: skip
        well_formed = decision.action is not None
        if result["done"]:
            self.reward, self.final_info = float(result["reward"]), result["info"]
            ended_by = "server_truncated" if result["info"].get("truncated") else "purchase"
            return Step(entry, well_formed, valid, ended_by=ended_by)
        next_turn = Turn(self.goal, turn.goal_set, self.instruction, result["observation"],
                         result["available_actions"], turn.index + 1)  # fmt: skip
        return Step(entry, well_formed, valid, next_turn=next_turn)

    def labels(self) -> dict[str, Any]:
        return {}

    def category(self) -> str:
        if self.first_info.get("category"):
            return str(self.first_info["category"])
        if self.prepared.catalog is not None:
            goal = self.prepared.catalog.goal(self.prepared.goal_set, self.goal)
            return str(goal.category or UNKNOWN_CATEGORY)
        return UNKNOWN_CATEGORY

    def result(self) -> dict[str, Any]:
        return {"reward": self.reward, "success": is_success(self.reward)}

    def reward_info(self) -> Any:
        return self.final_info.get("reward_info")


# ---- every other environment: its spec, as the agent loop plays it -------------------------------------------------
class SpecPlay(EnvPlay):
    """An environment through its spec and its ``/<env>/v1`` routes (see the module docstring)."""

    def client(self, config: EvalConfig) -> EnvClient:
        return EnvClient(config.url, self.env.env_id, timeout=max(config.env_timeout, 60.0),
                         retry_budget=config.env_retry_budget_s, max_connections=max(16, 2 * config.concurrency))  # fmt: skip

    async def prepare(self, client: EnvClient, config: EvalConfig) -> Prepared:
        env_id = self.env.env_id
        tasks = env_tasks(env_id, config.split, config.max_samples, config.tasks)
        if not tasks:
            raise EvalError(f"the {config.split} split of {env_id} is empty")
        try:
            await client.wait_until_ready(config.ready_timeout)
            info = await client.info()
        except ServiceRequestError as error:
            raise EvalError(
                f"the service at {config.url} does not serve {env_id} ({error}); start it with ENVS=...,{env_id} "
                "(make up-local / docker compose: AGENTRL_ENVS)"
            ) from error
        except ServiceError as error:
            raise EvalError(str(error)) from error
        if tasks[-1] >= int(info.get("tasks", 0)):
            raise EvalError(
                f"{env_id} on {config.url} has {info.get('tasks')} tasks; the split needs {tasks[-1] + 1}"
            )
        return Prepared(tasks, None, info)

    def build_policy(self, spec: PolicySpec, client: EnvClient, prepared: Prepared, out: Path) -> Policy:
        return build_env_policy(spec, self.env, client, out, prepared.info.get("fingerprint"))

    def chat_spec(self) -> envs.EnvSpec:
        return self.env

    def identity(self, config: EvalConfig, prepared: Prepared, policy: dict[str, Any]) -> dict[str, Any]:
        return {"env": self.env.env_id, "policy": policy, "split": config.split, "max_turns": config.max_turns,
                "env_fingerprint": prepared.info.get("fingerprint")}  # fmt: skip

    def episode(self, client: EnvClient, config: EvalConfig, prepared: Prepared, task: int) -> EpisodePlay:
        return _SpecEpisode(self.env, client, config, task, self.max_observation_chars)

    def heading(self) -> dict[str, Any]:
        env = self.env
        return {"env": env.env_id, "env_title": env.title, "reward_rule": env.reward_rule,
                "success_rule": env.success_rule}  # fmt: skip

    def random_policy_seed(self, seed: int) -> str:
        return f"Random('{seed}:{self.env.env_id}:<task>')"

    def config_fields(self, config: EvalConfig, prepared: Prepared) -> dict[str, Any]:
        env_id = self.env.env_id
        return {"env": env_id, "goal_set": None, "tasks": [prepared.tasks[0], prepared.tasks[-1]],
                "task_split": f"agent_trainer.env_data.split_tasks({env_id!r}, {SPLIT_OF[config.split]!r})"}  # fmt: skip

    def service(self, prepared: Prepared, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        info = prepared.info
        return {"env_service": {k: info.get(k) for k in ("env", "tasks", "fingerprint") if k in info}}


class _SpecEpisode(EpisodePlay):
    """An episode played as the agent loop plays it: one reply, one turn, through the very code the agent loop and
    the 0.7.1 interaction play it with (``episode.play_turn``); eval pays no invalid-reply penalty and ends an
    episode the server refuses, as training's defaults do. Its figures are the turn scores' (``episode_summary``)."""

    def __init__(self, env: envs.EnvSpec, client: EnvClient, config: EvalConfig, task: int,
                 max_observation_chars: int) -> None:  # fmt: skip
        self.env, self.client, self.config, self.task = env, client, config, task
        self.settings = InteractionSettings(invalid_action_penalty=0.0, on_env_error="terminate",
                                            max_observation_chars=max_observation_chars)  # fmt: skip
        self.played: Episode | None = None
        self.info: dict[str, Any] = {}
        self.scores: list[TurnScore] = []

    async def start(self) -> Turn:
        first = await self.client.reset(self.task)
        opening = self.env.first_message(first)
        self.instruction, self.info = instruction_of(opening), first.get("info") or {}
        self.played = Episode(state=first["state"], goal=self.task, goal_set=None, split=self.config.split)
        return Turn(self.task, self.env.env_id, self.instruction, opening, _listed(first), 0)

    async def step(self, decision: Decision, turn: Turn) -> Step:
        assert self.played is not None
        played = await episode.play_turn(self.env, self.settings, self.client, self.played, decision.output)
        self.scores.append(played.score)
        parsed, outcome, result = played.parsed, played.outcome, played.result
        if played.error is not None:
            return Step(None, parsed.well_formed, False, ended_by="env_error", note=str(played.error))
        entry = {"observation": turn.observation, "available_actions": turn.available_actions,
                 "output": decision.output, "action": parsed.action, "reward": outcome.env_reward,
                 "done": outcome.done, "valid": outcome.valid, "well_formed": parsed.well_formed}  # fmt: skip
        if outcome.done:
            return Step(entry, parsed.well_formed, outcome.valid, ended_by="done")
        message = episode.next_message(self.env, played, self.settings)
        next_turn = Turn(self.task, self.env.env_id, self.instruction, message, _listed(result) if result else {},
                         turn.index + 1)  # fmt: skip
        return Step(entry, parsed.well_formed, outcome.valid, next_turn=next_turn)

    def labels(self) -> dict[str, Any]:
        return {"env": self.env.env_id, "task": self.task}

    def category(self) -> str:
        """BabyAI's level (``GoToRedBall`` of ``BabyAI-GoToRedBall-v0``), else the environment's id."""
        level = str(self.info.get("level") or "")
        return level.removeprefix("BabyAI-").removesuffix("-v0") if level else self.env.env_id

    def result(self) -> dict[str, Any]:
        summary = episode_summary(self.scores)
        return {"reward": float(summary["env_reward"]), "score": float(summary["score"]),
                "success": bool(summary["success"])}  # fmt: skip

    async def close(self) -> None:
        if self.env.holds_simulator and self.played is not None:
            await episode.close_quietly(
                self.client, self.played.state
            )  # the server reaps idle episodes anyway


def _listed(result: Mapping[str, Any]) -> dict[str, Any]:
    """The actions the environment lists on this step (BabyAI's ``available_actions``), for the random policy."""
    listed = (result.get("info") or {}).get("available_actions")
    return {"actions": list(listed)} if listed else {}


#: ``EnvSpec.eval_protocol`` -> how eval plays the environment.
PLAYS: dict[str, type[EnvPlay]] = {"spec": SpecPlay, "pages": PagePlay}


def play_of(env_id: str, max_observation_chars: int = 0) -> EnvPlay:
    """How eval plays ``env_id`` (its spec's ``eval_protocol``); ``max_observation_chars``: the policy's setting."""
    try:
        env = envs.get(env_id)
    except envs.UnknownEnvironment as error:
        raise EvalError(str(error)) from None
    if env.eval_protocol not in PLAYS:
        raise EvalError(f"{env_id}'s spec names the eval protocol {env.eval_protocol!r}; eval knows "
                        f"{', '.join(PLAYS)}")  # fmt: skip
    return PLAYS[env.eval_protocol](env, max_observation_chars)


# ---- the run -------------------------------------------------------------------------------------------------------
def evaluate(config: EvalConfig, spec: PolicySpec, env_id: str = envs.WEBSHOP) -> EvalResult:
    """Synchronous entry point (the CLI's)."""
    return asyncio.run(evaluate_async(config, spec, env_id=env_id))


async def evaluate_async(config: EvalConfig, spec: PolicySpec, policy: Policy | None = None,
                         env_id: str = envs.WEBSHOP) -> EvalResult:  # fmt: skip
    """Run (or resume) the evaluation of ``env_id`` into ``config.out`` and write its outputs; see the module
    docstring. ``policy``: one the caller started (a mixed evaluation shares its model server), used as it is and
    left open."""
    if config.max_turns < 1:
        raise EvalError("--max-steps (--max-turns) must be at least 1")
    if config.concurrency < 1:
        raise EvalError("--concurrency must be at least 1")
    play = play_of(env_id, spec.max_observation_chars)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    client = play.client(config)
    try:
        prepared = await play.prepare(client, config)
        tasks = prepared.tasks
        owned = policy is None
        if policy is None:
            policy = play.build_policy(spec, client, prepared, out)
        if isinstance(policy, OpenAIPolicy):
            policy.env_spec = play.chat_spec()
        use_budget(policy, spec, env_id)
        identity = play.identity(config, prepared, _identity(policy.describe()))
        done = _prepare_out_dir(out, identity, config.overwrite)
        done = {key: record for key, record in done.items() if record["goal"] in set(tasks)}
        todo = [task for task in tasks if _key(prepared.goal_set, task) not in done]
        runner = _Runner(config, client, policy, play, prepared)
        failures: list[dict[str, Any]] = []
        if todo:
            if owned:
                await policy.start()
            try:
                failures = await runner.run(todo, out / TRAJECTORIES, already=len(done), total=len(tasks))
            finally:
                if owned:
                    await policy.close()
        records = {**done, **{_key(prepared.goal_set, r["goal"]): r for r in runner.finished}}
    finally:
        await client.aclose()

    ordered = sorted(records.values(), key=lambda r: r["goal"])
    not_run = len(tasks) - len(ordered) - len(failures)
    metrics = summarize(ordered, bootstrap_seed=spec.seed)
    metrics.update(play.heading())
    metrics.update(
        complete=not failures and not_run == 0,
        requested_episodes=len(tasks),
        resumed_episodes=len(done),
        failed_episodes=failures,
        not_run=not_run,
        policy=policy.describe(),
        seeds={
            "seed": spec.seed,
            "random_policy": play.random_policy_seed(spec.seed),
            "sampling": spec.seed if spec.name in ("openai", "checkpoint") else None,
            "bootstrap": spec.seed,
        },
        config={**_jsonable(asdict(config)), **play.config_fields(config, prepared)},
        **play.service(prepared, ordered),
        wall_s=round(time.monotonic() - started, 3),
        created_unix=int(time.time()),
    )
    if isinstance(policy, OpenAIPolicy):
        metrics["endpoint"] = {"requests": policy.requests, "retried": policy.retried}
    (out / METRICS).write_text(json.dumps(metrics, indent=2) + "\n")
    if config.write_report:
        from .report_html import write_report

        write_report(out / REPORT, metrics, ordered)
    return EvalResult(metrics=metrics, out=out, complete=bool(metrics["complete"]), failures=failures)


class _Runner:
    """Runs episodes with bounded concurrency; collects finished records and policy failures."""

    def __init__(
        self, config: EvalConfig, client: Any, policy: Policy, play: EnvPlay, prepared: Prepared
    ) -> None:
        self.config = config
        self.client = client
        self.policy = policy
        self.play = play
        self.prepared = prepared
        self.finished: list[dict[str, Any]] = []

    async def run(self, goals: list[int], path: Path, already: int, total: int) -> list[dict[str, Any]]:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for goal in goals:
            queue.put_nowait(goal)
        failures: list[dict[str, Any]] = []
        stop = asyncio.Event()
        bar = _Progress(total, already, self.config.progress, self.policy.name)
        fatal: list[BaseException] = []

        with open(path, "a", encoding="utf-8") as sink:

            async def worker() -> None:
                while not stop.is_set():
                    try:
                        goal = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    try:
                        record = await self.episode(goal)
                    except PolicyError as error:
                        failures.append(
                            {"goal": goal, "goal_set": self.prepared.goal_set, "error": str(error)}
                        )
                        if len(failures) >= self.config.max_policy_errors:
                            stop.set()
                        continue
                    except (ServiceError, EvalError) as error:
                        fatal.append(error)
                        stop.set()
                        return
                    sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                    sink.flush()
                    self.finished.append(record)
                    bar.update(record)

            workers = [asyncio.create_task(worker()) for _ in range(min(self.config.concurrency, len(goals)))]
            try:
                await asyncio.gather(*workers)
            finally:
                for task in workers:
                    task.cancel()
                bar.close()
        if fatal:
            error = fatal[0]
            kept = already + len(self.finished)
            if isinstance(error, ServiceRequestError):
                raise EvalError(
                    f"the environment refused a request: {error} ({kept} episodes kept)"
                ) from error
            if isinstance(error, ServiceUnavailable):
                raise EvalError(
                    f"the environment became unreachable: {error}. {kept} finished episodes are kept in "
                    f"{path}; rerun the same command to resume"
                ) from error
            raise EvalError(str(error)) from error
        return failures

    async def episode(self, goal: int) -> dict[str, Any]:
        """Play one episode; the record that goes into ``trajectories.jsonl``."""
        started = time.monotonic()
        play = self.play.episode(self.client, self.config, self.prepared, goal)
        turn = await play.start()
        agent = await self.policy.begin(turn)
        steps: list[dict[str, Any]] = []
        usage: dict[str, int] = {}
        ended_by, note = "max_turns", ""
        invalid = unparsed = 0
        spent = ResponseBudget(response_cap(self.config, self.play.env.env_id))
        try:
            for _ in range(self.config.max_turns):
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
                step = await play.step(decision, turn)
                unparsed += not step.well_formed
                if step.entry is None:  # nothing was played: the environment ended the episode
                    ended_by, note = step.ended_by or ended_by, step.note
                    break
                steps.append(step.entry)
                invalid += not step.valid
                if step.ended_by is not None:
                    ended_by = step.ended_by
                    break
                assert step.next_turn is not None
                turn = step.next_turn
                agent.observe(turn, decision, step.valid)
        finally:
            await play.close()
        record: dict[str, Any] = {
            **play.labels(),
            "goal": goal,
            "goal_set": self.prepared.goal_set,
            "split": self.config.split,
            "category": play.category(),
            "instruction": play.instruction,
            "policy": self.policy.name,
            **play.result(),
            "steps": len(steps),
            "invalid_actions": invalid,
            "unparsed_outputs": unparsed,
            "truncated": ended_by in ("max_turns", "server_truncated", "response_budget"),
            "ended_by": ended_by,
            "reward_info": play.reward_info(),
            "elapsed_s": round(time.monotonic() - started, 4),
        }
        if usage:
            record["usage"] = usage
        if note:
            record["note"] = note
        record["turns"] = steps
        return record


# ---- helpers ----------------------------------------------------------------------------------------------
def _key(goal_set: str | None, goal: int) -> str:
    """The resumption key of an episode (its goal set, None for a spec-played environment, and its task)."""
    return f"{goal_set}:{goal}"


#: What a policy's description holds that does not change what its episodes mean: where its server runs, and
#: what it knows only once started (the random policy's action pool).
_VOLATILE = {"base_url", "retries", "timeout_s", "server_args", "pool_size"}


def _identity(description: dict[str, Any]) -> dict[str, Any]:
    """The parts of a policy description that change what episodes mean (not where the server runs)."""
    return {k: v for k, v in description.items() if k not in _VOLATILE}


def _prepare_out_dir(out: Path, identity: dict[str, Any], overwrite: bool) -> dict[str, dict[str, Any]]:
    """Finished episodes to keep (by key); refuses to mix runs of different configurations."""
    config_path, trajectories = out / RUN_CONFIG, out / TRAJECTORIES
    if overwrite:
        for name in (TRAJECTORIES, METRICS, REPORT, RUN_CONFIG):
            (out / name).unlink(missing_ok=True)
    if config_path.exists():
        previous = json.loads(config_path.read_text())
        if previous != identity:
            changed = sorted(k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k))
            raise EvalError(
                f"{out} holds an evaluation with a different configuration (differs in: "
                f"{', '.join(changed)}); "
                "use another --out, or --overwrite to discard it"
            )
    elif trajectories.exists() and trajectories.stat().st_size:
        raise EvalError(f"{trajectories} exists without {RUN_CONFIG}; use another --out or --overwrite")
    config_path.write_text(json.dumps(identity, indent=2) + "\n")
    done: dict[str, dict[str, Any]] = {}
    if trajectories.exists():
        valid_lines = []
        for line in trajectories.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                done[_key(record["goal_set"], int(record["goal"]))] = record
                valid_lines.append(line)
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by an interrupted run: that episode runs again
        trajectories.write_text("".join(f"{line}\n" for line in valid_lines), encoding="utf-8")
    return done


def _category_source(records: list[dict[str, Any]], have_catalog: bool) -> str:
    """Where the episodes' categories came from (reported so an all-"unknown" breakdown explains itself)."""
    if have_catalog:
        return "catalog"
    if records and all(r.get("category") not in (None, UNKNOWN_CATEGORY) for r in records):
        return "server"
    return "unknown (pass --catalog for per-category results)"


def _open_catalog(path: Path, served_fingerprint: str) -> Any:
    from agent_envs.envs.webshop.catalog.store import open_catalog

    try:
        catalog = open_catalog(path)
    except Exception as error:
        raise EvalError(f"cannot open the catalog {path}: {error}") from error
    if catalog.fingerprint != served_fingerprint:
        raise EvalError(
            f"--catalog {path} (fingerprint {catalog.fingerprint}) is not the catalog the server serves "
            f"({served_fingerprint}); pass the served catalog or leave --catalog out"
        )
    return catalog


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class _Progress:
    """A tqdm bar with the running score and success rate (silent when ``enabled`` is false)."""

    def __init__(self, total: int, initial: int, enabled: bool, name: str) -> None:
        self._bar: Any = None
        self._rewards: list[float] = []
        self._solved = 0
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=f"eval {name}", unit="ep", dynamic_ncols=True)

    def update(self, record: dict[str, Any]) -> None:
        self._rewards.append(record["reward"])
        self._solved += solved(record)
        if self._bar is not None:
            n = len(self._rewards)
            score = 100 * sum(self._rewards) / n
            success = self._solved / n
            self._bar.set_postfix_str(f"score {score:.1f} success {success:.2f}", refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
