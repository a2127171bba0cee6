"""The environment contract: what one text environment gives the serving layer.

Every environment is a *pure core* (no web framework, no I/O on the request path beyond its own simulator) in a
package of its own under ``agent_envs.envs``, registered by id in ``agent_envs.envs.registry``. The serving
layer (native protocol, AgentGym-compatible routes, tokens, sessions, limits, metrics) is written once against
this contract, so adding an environment is one package and one registry line (docs/environments.md).

Two kinds of state (``state_travel``):

- ``"token"``: the episode state is a small JSON value that fully determines what comes next (a deterministic
  environment: compact state, or task + actions replayed). The serving layer signs it into the client's state
  token, so any replica serves any step and a replica's death loses nothing. SciWorld is one too: its live
  simulator (a JVM) stays in the replica that serves the episode (the balancer keeps the episode there), and a
  replica without it replays the actions on a fresh JVM, which is deterministic (docs/environments/sciworld.md).
- ``"session"``: reserved for an environment whose episode cannot be rebuilt anywhere else; none needs it yet.

The AgentGym-compatible side of an environment is also pure: ``agentgym_routes()`` lists the routes of
AgentGym's own server for it, each a function from (environment, session, request fields) to (response body,
new session). The serving layer only stores sessions and maps HTTP onto these functions, so the wire shapes,
field names and error texts of each original live next to the environment that has them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

JSON = Any  # a value orjson can encode: dict / list / str / int / float / bool / None
StateTravel = Literal["token", "session"]


class EnvError(ValueError):
    """The caller's fault (bad task, bad state, finished episode): the HTTP layer answers ``status`` with
    ``{"error": kind, "detail": message}``."""

    status = 400
    kind = "bad_request"


class UnknownTask(EnvError):
    """A task index outside the environment's task list."""

    status = 404
    kind = "unknown_task"


class EpisodeOver(EnvError):
    """A step on an episode that has ended (and whose environment does not allow stepping on)."""

    status = 409
    kind = "episode_finished"


class BadState(EnvError):
    """A state that does not fit this environment (another version's data, a hand-made value)."""

    status = 400
    kind = "invalid_state"


class EpisodeLost(EnvError):
    """The simulator holding a session-held episode is gone and the episode cannot be rebuilt: retryable by
    starting a new episode (503, ``Retry-After``)."""

    status = 503
    kind = "episode_lost"


@dataclass(frozen=True)
class Transition:
    """What ``reset`` and ``step`` return.

    ``state`` is what the next ``step`` needs (JSON for ``state_travel == "token"``). ``info`` holds the
    environment's extra fields (e.g. ``score``, ``available_actions``, ``valid``), all JSON.
    """

    observation: str
    reward: float
    done: bool
    state: JSON
    info: Mapping[str, JSON] = field(default_factory=dict)


@runtime_checkable
class TextEnv(Protocol):
    """One environment's pure core (Gymnasium's ``Env`` in spirit: reset(task) -> first step; step(state,
    action) -> next; nothing mutated, so one instance serves every episode concurrently)."""

    env_id: ClassVar[str]
    state_travel: ClassVar[StateTravel]

    def task_count(self) -> int:
        """How many tasks (``0 .. task_count() - 1``)."""
        ...

    def fingerprint(self) -> str:
        """The identity of the data behind the tasks (recipes, levels, package versions): bound into every
        state token, so a token made by a replica with other data never verifies."""
        ...

    def reset(self, task: int) -> Transition:
        """The first step of task ``task`` (raises ``UnknownTask``)."""
        ...

    def step(self, state: JSON, action: str) -> Transition:
        """The next step from ``state`` (raises ``BadState``, ``EpisodeOver``). Never mutates ``state``."""
        ...

    def expert(self, task: int) -> Sequence[str] | None:
        """A list of actions that solves ``task``, where one is cheap to compute (else None)."""
        ...


# Optional members a core may have (looked up with getattr; see docs/environments/adding.md):
#   blocking: bool                             True when its calls wait on another process (SciWorld's JVMs):
#                                              the serving layer then calls it in a thread pool, else inline
#   close(state) -> bool                       free the simulator an episode holds (SciWorld's JVM)
#   shutdown() -> None                         stop background work when the worker stops
#   stats() -> dict[str, int]                  this process's simulators, shown by GET /<env>/v1/info
#   is_success(done, reward, info) -> bool     what counts as solved, where "done with a positive last
#                                              reward" is wrong (SciWorld: done also on failure or time-out)


# ---- the AgentGym-compatible side ------------------------------------------------------------------------
KEEP: Any = object()  # CompatAnswer.session: leave the stored session as it is
DELETE: Any = object()  # CompatAnswer.session: remove the session (the id becomes unknown)


@dataclass(frozen=True)
class CompatCall:
    """One request to an AgentGym route, as the pure handler sees it."""

    env: TextEnv
    env_idx: int  # the session id (AgentGym's ``id``); for /create, the id just allocated
    session: JSON | None  # the stored session, None if the id is unknown (never created, closed, expired)
    args: Mapping[str, JSON]  # the request's other fields, validated and defaulted by the route's ``fields``


@dataclass(frozen=True)
class CompatAnswer:
    """The response body (JSON, sent with ``status``) and what becomes of the session."""

    body: JSON
    session: JSON = KEEP
    status: int = 200


@dataclass(frozen=True)
class CompatField:
    """A request field of an AgentGym route besides ``id``: its type and its default (``REQUIRED``: none)."""

    kind: Literal["int", "str", "str_or_null"]
    default: JSON = None
    required: bool = False


@dataclass(frozen=True)
class CompatRoute:
    """A route of AgentGym's server for one environment."""

    method: Literal["GET", "POST"]
    path: str  # as AgentGym's server has it ("/reset"); the serving layer mounts it under /<env_id>
    handler: Callable[[CompatCall], CompatAnswer]
    fields: Mapping[str, CompatField] = field(default_factory=dict)
    creates: bool = False  # /create: allocates a new id; the handler's ``session`` is the new session
    needs_id: bool = True  # every route but /create (and GET /) names a session by ``id``
    summary: str = ""
