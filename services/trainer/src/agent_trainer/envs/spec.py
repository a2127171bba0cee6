"""What the trainer knows about one environment: ``EnvSpec``, the one place per environment for everything the
model sees and everything the trainer counts.

A spec is pure (no I/O): the episode code (``agent_trainer.episode``, which both verl routes and eval play an
episode with) does the HTTP through the environment's client (``client``) and asks the spec how to turn the model's
reply into an action (``parse``), how to show the environment's answers to the model (``first_message``,
``step_message``) and what a step means for the episode (``outcome``: reward, end, success, validity). The dataset
builder (``agent_trainer.env_data``) takes the system prompt, the first turn, the task pool and the split rule from
the same spec (and the rows from its builder, ``rows``), so training, evaluation and data show the model one format
and one split.

Whatever is particular to an environment is a field of its spec, set in its module (``envs/<env>.py``), never a
branch on its id elsewhere: WebShop's goal sets and catalog (``split_rule``, ``reset_options``, ``rows``), its own
``/v1`` client (``connect``), the bare actions its scripted policies reply (``scripted_reply``), SciWorld's
simulator per episode (``holds_simulator``) and its split's order (``split_order``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


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


class DataError(ValueError):
    """Bad input for the dataset builder (the message says what to fix)."""


#: The three splits every environment's tasks are split into (WebShop calls ``val`` "eval", its goal range's name).
SPLITS = ("train", "val", "test")


@dataclass
class DataOptions:
    """Where an environment's data is, for the dataset builder, the splits and the in-process cores.

    Attributes:
        catalog: WebShop's prepared catalog (a directory, or the catalog opened: its goals and its simulator); the
            other environments ignore it.
        goal_set: WebShop's goal list (``synthetic`` or ``human``); the others ignore it.
        env_url: a service whose resets make the rows where an environment's core cannot be made here (the
            trainer images install the env package without the environments' extras; SciWorld needs Java).
        progress: a progress bar where resets are slow (SciWorld's).
    """

    catalog: Any = None
    goal_set: str = "synthetic"
    env_url: str | None = None
    progress: bool = True


def agentgym_reply(action: str) -> str:
    """The reply an AgentGym client reads ``action`` from (``Action: <action>``): how a scripted policy (the expert,
    the random policy, the preflight's oracle) writes an action so that the environment's parser reads it like a
    model's."""
    return f"Action: {action}"


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


@dataclass(frozen=True)
class EnvSpec:
    """One environment as the trainer sees it (see the module docstring).

    Attributes:
        env_id: the service's id (``/<env_id>/v1/...``; WebShop keeps its own routes), also the rows'
            ``data_source``, so verl groups validation metrics by environment.
        title: one line for docs and logs.
        system_prompt: the first message of every episode (task, action grammar, reply format).
        max_rounds: model turns per episode, each one env step (AgentGym-RL's ``max_rounds``; WebShop's 24, what
            the guides' 25 assistant turns allow): the episode length. A training config's
            ``environments.<env_id>.max_rounds`` is its one override (``agent_trainer.turns.rounds``).
        parse: reply -> ``Parsed``.
        first_message: the reset answer -> the first user turn.
        step_message: (step answer, parsed reply, outcome, max_observation_chars) -> the next user turn.
        outcome: (step answer, parsed reply) -> ``Outcome``.
        task_of: a dataset row's ``extra_info`` -> the task index.
        holds_simulator: the service keeps a live simulator per episode (SciWorld's JVM): the loop closes the
            episode when it ends, so the simulator is freed at once rather than when the server reaps it.
        reward_rule, success_rule: the definitions, in words (docs, ``agent-train envs``).
        task_count, split_of: the task pool (tasks ``0 .. task_count - 1``) and the split of a task (``train``,
            ``val`` or ``test``): the split rule every row, eval and rehearsal uses (:meth:`split_tasks`).
        display_name: the environment's name in reports and tables (``TextCraft``); default the id.
        split_order: the order of a split's tasks when it is not the index order (SciWorld: round-robin over its
            task types, so any prefix covers every type).
        split_rule: (split, data) -> the split's tasks, where they depend on local data rather than a fixed pool
            (WebShop: the goal ranges of the goal set in its catalog); replaces ``task_count``/``split_of``.
        reset_options: (a row's fields, the default goal set) -> keyword arguments of the client's ``reset`` besides
            the task (WebShop: ``goal_set`` and ``split``); None: none.
        connect: (url, **client options) -> the environment's client, where it is not the generic ``EnvClient``
            on ``/<env_id>/v1`` (WebShop: its own ``/v1`` protocol).
        rows: the dataset builder's class (``envs.rows.RowBuilder`` and its subclasses: WebShop's rows come from its
            catalog, SciWorld's from a pool of fresh JVMs); None: ``RowBuilder``.
        scripted_reply: action -> the reply a scripted policy sends (the parser reads it back as that action).
        checks_opening: the 0.7.1 interaction checks that a row's first user turn is what the service shows for its
            task (rows built for another task, environment or version fail at once). False for an environment whose
            rows may carry a first turn of their own (WebShop's, converted from other setups' data, have always
            been played on their goal whatever they show).
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
    display_name: str = ""
    split_order: Callable[[Iterable[int]], list[int]] | None = None
    split_rule: Callable[[str, DataOptions], list[int]] | None = None
    reset_options: Callable[[Mapping[str, Any], str | None], dict[str, Any]] | None = None
    connect: Callable[..., Any] | None = None
    rows: Callable[..., Any] | None = None
    scripted_reply: Callable[[str], str] = agentgym_reply
    checks_opening: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_rounds, int) or isinstance(self.max_rounds, bool) or self.max_rounds < 1:
            raise ValueError(f"{self.env_id}: max_rounds must be a positive integer, not {self.max_rounds!r}")
        if not self.display_name:
            object.__setattr__(self, "display_name", self.env_id)

    def split_tasks(self, split: str, data: DataOptions | None = None) -> list[int]:
        """The tasks of ``split`` (``train``, ``val``, ``test``): the spec's pool and rule (in ``split_order``), or
        its ``split_rule`` on ``data``. Every environment's splits are disjoint by construction."""
        if split not in SPLITS:
            raise DataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if self.split_rule is not None:
            return self.split_rule(split, data or DataOptions())
        if self.task_count is None or self.split_of is None:
            raise DataError(f"{self.env_id}: no dataset rule (its spec has no task_count and split_of)")
        tasks = [task for task in range(self.task_count) if self.split_of(task) == split]
        return self.split_order(tasks) if self.split_order is not None else tasks

    def client(self, url: str, **options: Any) -> Any:
        """The environment's native client on ``url`` (the balancer), with the generic client's ``options``
        (timeouts, retries, fallback addresses...)."""
        if self.connect is not None:
            return self.connect(url, **options)
        from webshop_env.client import envs as env_clients  # looked up now: tests serve it in process

        return env_clients.EnvClient(url, self.env_id, **options)

    def reset_kwargs(self, fields: Mapping[str, Any], default_goal_set: str | None = None) -> dict[str, Any]:
        """What the client's ``reset`` takes besides the task, from a row's fields (``extra_info`` and its
        ``interaction_kwargs``)."""
        return dict(self.reset_options(fields, default_goal_set)) if self.reset_options is not None else {}

    @property
    def agent_name(self) -> str:
        """The agent-loop entry for this environment (configs/webshop_agent_loop.yaml), a row's ``agent_name``."""
        return f"{self.env_id}_agent"

    @property
    def data_source(self) -> str:
        return self.env_id

    @property
    def ability(self) -> str:
        return f"agent/{self.env_id}"


def cut(observation: str, max_chars: int) -> str:
    """``observation`` cut at ``max_chars`` characters (0: never), marked as cut."""
    if max_chars and len(observation) > max_chars:
        return observation[:max_chars] + " ...(truncated)"
    return observation
