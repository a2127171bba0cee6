"""What the trainer knows about one environment: ``EnvSpec``, the one place per environment for everything the
model sees and everything the trainer counts.

A spec is pure (no I/O): the agent loop (``agent_trainer.agent_loop.EnvAgentLoop``) does the HTTP through the
environment's client and asks the spec how to turn the model's reply into an action (``parse``), how to show the
environment's answers to the model (``first_message``, ``step_message``) and what a step means for the episode
(``outcome``: reward, end, success, validity). The dataset builder (``agent_trainer.env_data``) takes the system
prompt and the first turn from the same spec, so training, evaluation and data show the model one format.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_envs.client import ServiceClient


@dataclass(frozen=True)
class Parsed:
    """What the trainer makes of one model reply.

    ``action`` is what is sent to the environment; ``None`` means nothing is sent and ``feedback`` is the next
    observation instead (AgentGym's clients answer a reply with several ``Action:`` themselves). ``well_formed``
    is False for a reply that named no usable action in the expected format: it counts as an invalid round and
    pays ``invalid_action_penalty``.
    """

    action: str | None
    well_formed: bool
    feedback: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What one step means for the episode, decided by the spec from the environment's answer.

    ``env_reward``: the episode's reward if it ends here (every environment here pays only at the end);
    ``done``: the episode ends with this step; ``success``: it ended solved; ``valid``: the environment accepted
    the action; ``finished``: the environment itself ended it (WebShop: a purchase, not a truncation).
    """

    env_reward: float
    done: bool
    success: bool
    valid: bool
    finished: bool

    @classmethod
    def not_sent(cls) -> Outcome:
        """A round whose reply was answered by the client (nothing reached the environment)."""
        return cls(env_reward=0.0, done=False, success=False, valid=False, finished=False)


class TaskError(ValueError):
    """A dataset row that names no task (or not as an index)."""


class CoreUnavailable(RuntimeError):
    """An environment's ``data_core`` cannot run on this machine (a simulator or its runtime is missing); the
    message says what to install."""


def task_index(fields: Mapping[str, Any], env_id: str = "") -> int:
    """The task a row names: ``task`` (or ``item_id``/``session_id``, AgentGym-RL's names), an int, ``"12"`` or
    ``"<env>_12"``."""
    for key in ("task", "item_id", "session_id"):
        value = fields.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        text = str(value).strip().rsplit("_", 1)[-1]
        if text.isdigit():
            return int(text)
        raise TaskError(f"{env_id} row: {key} = {value!r} is not a task index (an int or '{env_id}_<N>')")
    raise TaskError(
        f"{env_id} row: extra_info has no task (expected 'task'; keys: {sorted(fields)}); build the data with "
        "`agent-train data --env ...`"
    )


#: A recipe's ``project_name``: W&B's project names (no ``/``, ``#``, ``?``, ``%``, ``:`` or spaces).
_PROJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class TrainingRecipe:
    """An environment's GRPO recipe: the values its training configs set over the verl line's base
    (``configs/base/grpo_{test,train}.yaml``, which every run shares). ``agent-train configs --write`` writes its
    four training configs from it (``<id>_grpo_test`` / ``_train`` on both verl lines: :mod:`.overlays`), so an
    environment's recipe lives in its trainer module, beside its rounds (``EnvSpec.max_rounds``).

    Attributes:
        source: where the values come from, one phrase for the files' header ("AgentGym-RL's BabyAI settings
            (examples/train/AgentGym-RL/babyai_train.sh)").
        batch_size: prompts per step (``data.train_batch_size``); rollouts: responses per prompt (``rollout.n``);
            mini_batch_size: prompts per PPO update (``ppo_mini_batch_size``); ppo_epochs: PPO passes per batch.
        turn_tokens: new tokens per model turn; prompt_tokens: the first turn (``max_prompt_length``: system
            prompt and first observation); response_tokens: every later turn together (``max_response_length``).
        lr: the actor's learning rate.
        test_samples: a test run's training rows (``train_max_samples``): two steps of the batch (at least one of
            the test run's).
        epochs, save_freq: the full run's epochs and steps between checkpoints.
        full_gpu_memory_utilization: the full run's rollout memory share, where not the base's.
        first_turn: what the first turn holds, in words (the comment on ``max_prompt_length``).
        notes: more header lines (how a value was derived).
        test_batch_size, test_rollouts, test_mini_batch_size, test_response_tokens: a test run's own batch, rollouts
            per prompt, PPO mini-batch and response budget, where a test run is smaller than the recipe (WebShop's:
            the guides' small run); None: the recipe's. test_micro_batch_size: a test run's
            ``ppo_micro_batch_size_per_gpu`` (``AGENTRL_MICRO_BATCH_SIZE``; a full run keeps its base's).
        full_val_samples: the full run's validation rows at each ``test_freq`` step (``val_max_samples``;
            ``AGENTRL_VAL_MAX_SAMPLES``); -1: the whole validation split.
        full_rollout_tp: the full run's rollout tensor-parallel size (GPUs per rollout server,
            ``AGENTRL_ROLLOUT_TP``), where not the base's 1.
        project_name: the runs' project (``trainer.project_name``: W&B's project, the loggers' grouping).
    """

    source: str
    batch_size: int
    rollouts: int
    mini_batch_size: int
    turn_tokens: int
    prompt_tokens: int
    response_tokens: int
    test_samples: int
    lr: float = 1.0e-6
    ppo_epochs: int = 1
    epochs: int = 10
    save_freq: int = 25
    full_gpu_memory_utilization: float | None = None
    first_turn: str = "system prompt + the first observation"
    notes: tuple[str, ...] = ()
    test_batch_size: int | None = None
    test_rollouts: int | None = None
    test_mini_batch_size: int | None = None
    test_micro_batch_size: int = 1
    test_response_tokens: int | None = None
    full_val_samples: int = -1
    full_rollout_tp: int | None = None
    project_name: str = "agentgym-grpo"

    def __post_init__(self) -> None:
        counts = ("batch_size", "rollouts", "mini_batch_size", "turn_tokens", "prompt_tokens", "response_tokens",
                  "test_samples", "ppo_epochs", "epochs", "save_freq", "test_micro_batch_size")  # fmt: skip
        optional = ("test_batch_size", "test_rollouts", "test_mini_batch_size", "test_response_tokens",
                    "full_rollout_tp")  # fmt: skip
        for name in counts + tuple(n for n in optional if getattr(self, n) is not None):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"recipe: {name} = {value!r} must be a positive integer")
        if self.batch_size % self.mini_batch_size:
            raise ValueError(f"recipe: mini_batch_size {self.mini_batch_size} must divide batch_size "
                             f"{self.batch_size} (verl's check)")  # fmt: skip
        test = self.test_run
        if test["batch_size"] % test["mini_batch_size"]:
            raise ValueError(f"recipe: the test run's mini-batch {test['mini_batch_size']} must divide its batch "
                             f"{test['batch_size']} (verl's check)")  # fmt: skip
        if self.test_samples < test["batch_size"]:
            raise ValueError(f"recipe: test_samples {self.test_samples} is less than the test run's batch "
                             f"{test['batch_size']}: the run would train no step")  # fmt: skip
        if not 0 < self.lr < 1:
            raise ValueError(f"recipe: lr = {self.lr!r} must be in (0, 1)")
        value = self.full_val_samples
        if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
            raise ValueError(f"recipe: full_val_samples = {value!r} must be a positive integer or -1 (all)")
        if not isinstance(self.project_name, str) or not _PROJECT_NAME.fullmatch(self.project_name):
            raise ValueError(f"recipe: project_name = {self.project_name!r} must be a name of letters, digits, "
                             "'.', '_' and '-' (W&B's project)")  # fmt: skip

    @property
    def test_run(self) -> dict[str, int]:
        """A test run's batch, rollouts, mini-batch, micro-batch and response budget (its own, else the recipe's)."""
        own = {"batch_size": self.test_batch_size, "rollouts": self.test_rollouts,
               "mini_batch_size": self.test_mini_batch_size, "response_tokens": self.test_response_tokens}  # fmt: skip
        run = {name: getattr(self, name) if value is None else value for name, value in own.items()}
        return {**run, "micro_batch_size": self.test_micro_batch_size}

    @property
    def test_run_differs(self) -> bool:
        """A test run with a shape of its own (any ``test_*`` value other than the recipe's defaults)."""
        return self.test_micro_batch_size != 1 or any(
            getattr(self, name) is not None
            for name in ("test_batch_size", "test_rollouts", "test_mini_batch_size", "test_response_tokens")
        )


def served_client(base_url: str, env_id: str, **options: Any) -> ServiceClient:
    """The client of the routes every served environment shares (``/<env_id>/v1/...``): ``EnvClient``, looked up
    when called (``agent_envs.client.envs``), so a test's in-process client stands in for it."""
    from agent_envs.client import envs as clients

    return clients.EnvClient(base_url, env_id, **options)


@dataclass(frozen=True)
class EnvSpec:
    """One environment as the trainer sees it (see the module docstring).

    Attributes:
        env_id: the service's id (``/<env_id>/v1/...``; WebShop keeps its own routes), also the rows'
            ``data_source``, so verl groups validation metrics by environment.
        title: one line for docs and logs.
        system_prompt: the first message of every episode (task, action grammar, reply format).
        max_rounds: model turns per episode, each one env step (AgentGym-RL's ``max_rounds``; WebShop's 24): the
            environment's episode length, which only a training config's ``environments.<env_id>.max_rounds``
            overrides (``turns.episode_rounds``, read by both verl paths and eval).
        parse: reply -> ``Parsed``.
        first_message: the reset answer -> the first user turn.
        step_message: (step answer, parsed reply, outcome, max_observation_chars) -> the next user turn.
        outcome: (step answer, parsed reply) -> ``Outcome``.
        task_of: a dataset row's ``extra_info`` -> the task index.
        holds_simulator: the service keeps a live simulator per episode (SciWorld's JVM): the loop closes the
            episode when it ends, so the simulator is freed at once rather than when the server reaps it.
        reward_rule, success_rule: the definitions, in words (docs, ``agent-train envs``).
        reset_fields: the row's fields (``interaction_kwargs`` / ``extra_info``) that the environment's reset also
            takes, by name; each defaults to the interaction setting of that name where there is one (WebShop:
            ``goal_set``, ``split``; the others: none, a task is all their reset takes).
        task_count, split_of: the task pool (tasks ``0 .. task_count - 1``) and the split of a task (``train``,
            ``val`` or ``test``): the dataset builder's and eval's splits (``agent_trainer.env_data.split_tasks``);
            None for an environment whose tasks are a catalog's goals (``needs_catalog``).
        task_order: the order of a split's tasks where index order would not do (SciWorld: round-robin over its
            task types, so any prefix covers every type); None: index order.
        data_core: a core of the dataset builder's own, made for ``workers`` resets at once, where the registry's
            shared core would not do (SciWorld: each reset in a fresh JVM); raises ``CoreUnavailable`` where it
            cannot run here (the builder then uses a service's resets). None: ``registry.make``'s core.
        category_label: what the report calls the groups of ``metrics.by_category`` (BabyAI's are levels).
        eval_protocol: how ``agent-train eval`` plays the environment (``evaluation.runner.PLAYS``): ``"spec"``,
            as the agent loop does (the tasks of the training data's split, the spec's user turns, every reply
            through ``parse``); ``"pages"``, WebShop's own protocol (the service's goal sets and their splits,
            the page and its actions handed to the policy as they are, the expert's actions sent verbatim, since
            the environment matches a label character for character and the reply parser normalises it).
        needs_catalog: the environment's tasks are the goals of the product catalog (WebShop's) and its first turn
            the catalog's page for a goal: a CPU run picks them with the catalog's oracle and plays them on a core
            built on the catalog, and a run of this environment alone keeps the catalog's own rows (``agent-train
            data``) and folders; the dataset builder opens the catalog (``--catalog``), splits its goal ranges and
            builds the rows from it; a local env cluster started with a catalog serves this environment, so the
            catalog's fingerprint can be checked on the service before it is reused. False: tasks come from the
            environment's core and its expert (``core.expert``).
        recipe: its GRPO recipe (:class:`TrainingRecipe`), from which its training configs are written
            (``agent-train configs --write``); None: the environment has no training configs of its own.
    """

    env_id: str
    title: str
    system_prompt: str
    max_rounds: int
    parse: Callable[[str], Parsed]
    first_message: Callable[[Mapping[str, Any]], str]
    step_message: Callable[[Mapping[str, Any], Parsed, Outcome, int], str]
    outcome: Callable[[Mapping[str, Any], Parsed], Outcome]
    reward_rule: str
    success_rule: str
    task_of: Callable[[Mapping[str, Any]], int] = task_index
    holds_simulator: bool = False
    task_count: int | None = None
    split_of: Callable[[int], str] | None = None
    reset_fields: tuple[str, ...] = ()
    eval_protocol: str = "spec"
    needs_catalog: bool = False
    client: Callable[..., ServiceClient] = served_client
    task_order: Callable[[Iterable[int]], list[int]] | None = None
    data_core: Callable[[int], Any] | None = None
    category_label: str = "category"
    recipe: TrainingRecipe | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise ValueError(f"{self.env_id} spec: max_rounds = {self.max_rounds!r} must be a positive integer "
                             "(the environment's model turns per episode)")  # fmt: skip

    @property
    def agent_name(self) -> str:
        """The agent-loop entry for this environment (configs/agent_loop.yaml), a row's ``agent_name``."""
        return f"{self.env_id}_agent"

    @property
    def data_source(self) -> str:
        return self.env_id

    @property
    def ability(self) -> str:
        return f"agent/{self.env_id}"

    @property
    def name(self) -> str:
        """The environment's name as the reports write it (``WebShop``, ``TextCraft``): its title up to the colon,
        so a new environment is named by the title it declares."""
        return self.title.split(":", 1)[0].strip()


def cut(observation: str, max_chars: int) -> str:
    """``observation`` cut at ``max_chars`` characters (0: never), marked as cut."""
    if max_chars and len(observation) > max_chars:
        return observation[:max_chars] + " ...(truncated)"
    return observation


def observation_message(
    result: Mapping[str, Any], parsed: Parsed, outcome: Outcome, max_observation_chars: int
) -> str:
    """A ``step_message`` that shows the environment's answer as it is (cut at ``max_observation_chars``), or the
    client's own answer where nothing was sent (``parsed.feedback``): TextCraft's, BabyAI's and Sokoban's."""
    if parsed.action is None:
        return parsed.feedback or ""
    return cut(str(result.get("observation", "")), max_observation_chars)
