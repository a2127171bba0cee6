"""One episode of any environment, one turn at a time: the per-episode logic both verl routes share.

``agent_loop.EnvAgentLoop`` (verl's agent-loop route, 0.7.1 and 0.9.1) and ``interaction.EnvInteraction`` (verl
0.7.1's ``ToolAgentLoop`` + ``BaseInteraction`` route) differ only in who owns the token stream; what one reply
does to the episode is decided here, once:

- :func:`reset`: the environment's first answer for a task, through its native client (WebShop: goal set and
  split; the others: the task index);
- :func:`play_turn`: the reply parsed by the environment's spec (``EnvSpec.parse``), the action sent (or, for a
  reply AgentGym's client answers itself, nothing), the spec's ``Outcome``, and the turn's ``TurnScore``: what
  the episode's reward changed by (``env_reward`` so far minus what was paid before, less the invalid-reply
  penalty), so the turn scores of an episode sum to its reward, with the spec's success on every turn;
- :func:`next_message`: the spec's user turn for the environment's answer;
- :func:`episode_slot`: admission for an environment that holds a simulator per live episode (SciWorld's JVM):
  at most the fleet's simulators' worth of episodes at once, the others wait for a slot instead of evicting each
  other's simulators (each eviction costs a replay of seconds on the next step).

The episode's progress (signed state token, reward so far, counters) is the :class:`Episode` record that both
routes keep in the process's ``EPISODES`` registry (``interaction``), and each turn's reward is a
:class:`TurnScore` (the float verl sums, carrying what the turn did): both are defined here, below every route
that uses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from agent_envs.client import ServiceRequestError

from .config import InteractionSettings
from .envs.spec import EnvSpec, Outcome, Parsed

logger = logging.getLogger(__name__)


class TurnScore(float):
    """A turn's reward, carrying what happened in that turn (it pickles across Ray processes).

    ``purchased``: this turn bought something (the env paid a reward); ``stepped``: the env took a step (False
    for a trajectory ended because its episode expired or the server refused it); ``success``: set by the agent
    loop (any environment: the episode is solved if it ends here, by its spec's rule), None on the interaction
    path (WebShop's rule then applies, ``reward.episode_summary``).
    """

    invalid: bool
    done: bool
    env_reward: float
    purchased: bool
    stepped: bool
    success: bool | None

    def __new__(
        cls,
        value: float,
        *,
        invalid: bool = False,
        done: bool = False,
        env_reward: float = 0.0,
        purchased: bool = False,
        stepped: bool = True,
        success: bool | None = None,
    ):
        score = super().__new__(cls, value)
        score.invalid = invalid
        score.done = done
        score.env_reward = env_reward
        score.purchased = purchased
        score.stepped = stepped
        score.success = success
        return score

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _turn_score,
            (
                float(self),
                self.invalid,
                self.done,
                self.env_reward,
                self.purchased,
                self.stepped,
                self.success,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"TurnScore({float(self)!r}, invalid={self.invalid}, done={self.done}, env_reward={self.env_reward}, "
            f"purchased={self.purchased}, stepped={self.stepped}, success={self.success})"
        )


def _turn_score(
    value: float,
    invalid: bool,
    done: bool,
    env_reward: float,
    purchased: bool = False,
    stepped: bool = True,
    success: bool | None = None,
) -> TurnScore:
    return TurnScore(value, invalid=invalid, done=done, env_reward=env_reward, purchased=purchased, stepped=stepped,
                     success=success)  # fmt: skip


@dataclass
class Episode:
    """One trajectory's env state: the signed token and counters (nothing else is kept)."""

    state: str
    goal: int
    goal_set: str | None
    split: str | None
    steps: int = 0
    invalid: int = 0
    unparseable: int = 0
    reward: float = 0.0
    last_used: float = 0.0


#: What a step the environment refused means for the episode: it ends, unsolved, without an env step.
REFUSED = Outcome(env_reward=0.0, done=True, success=False, valid=False, finished=False)


@dataclass(frozen=True)
class Turn:
    """What one model reply did: the spec's reading of it, the environment's answer (``{}`` when nothing reached
    the environment), the spec's ``Outcome``, the turn's score and, for a step the server refused, its error."""

    parsed: Parsed
    result: Mapping[str, Any]
    outcome: Outcome
    score: TurnScore
    error: ServiceRequestError | None = None

    @property
    def done(self) -> bool:
        """The episode ends with this turn (the environment said so, or it refused the step)."""
        return self.outcome.done


def reset_options(spec: EnvSpec, row: Mapping[str, Any], settings: Any) -> dict[str, Any]:
    """What the environment's reset takes besides the task (``spec.reset_fields``): the row's value, else the
    setting of that name (WebShop's ``goal_set``), else None (the server's default)."""
    return {name: row.get(name) or getattr(settings, name, None) for name in spec.reset_fields}


async def reset(
    spec: EnvSpec, client: Any, task: int, options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The environment's first answer for ``task``, with ``options`` (``reset_options``) where its spec takes any."""
    chosen = {name: (options or {}).get(name) for name in spec.reset_fields}
    return await client.reset(task, **chosen)


async def play_turn(
    spec: EnvSpec,
    settings: InteractionSettings,
    client: Any,
    episode: Episode,
    reply: str,
    *,
    metrics: MutableMapping[str, float] | None = None,
    instance_id: str = "",
) -> Turn:
    """Play one model reply: parse, step (unless the client answers it), score; ``episode`` moves on.

    A step the server refuses (4xx: expired or foreign state) raises with ``on_env_error: raise``, else ends the
    episode with reward 0 (the turn's score takes back what was paid). ``metrics`` gets verl's ``tool_calls``
    timing of the step.
    """
    parsed = spec.parse(reply)
    result: Mapping[str, Any] = {}
    if parsed.action is None:  # the client answers the reply itself (AgentGym: several actions)
        outcome = Outcome.not_sent()
    else:
        try:
            with _timer(metrics):
                result = await client.step(episode.state, parsed.action)
        except ServiceRequestError as error:
            if settings.on_env_error == "raise":
                raise
            logger.warning("%s refused a step of %s: %s; ending the trajectory with reward 0",
                           spec.env_id, instance_id or "an episode", error)  # fmt: skip
            score = TurnScore(-episode.reward, done=True, stepped=False, success=False)
            episode.reward = 0.0
            return Turn(parsed, {}, REFUSED, score, error)
        outcome = spec.outcome(result, parsed)
        episode.state = result["state"]
    penalty = settings.invalid_action_penalty if not parsed.well_formed else 0.0
    score = TurnScore(outcome.env_reward - episode.reward - penalty, invalid=not outcome.valid, done=outcome.done,
                      env_reward=outcome.env_reward, purchased=outcome.finished,
                      success=outcome.success)  # fmt: skip
    episode.reward = outcome.env_reward
    episode.steps += 1
    episode.invalid += 0 if outcome.valid else 1
    episode.unparseable += 0 if parsed.well_formed else 1
    return Turn(parsed, result, outcome, score)


def next_message(spec: EnvSpec, turn: Turn, settings: InteractionSettings) -> str:
    """The user turn that shows the model the environment's answer (the spec's format)."""
    if turn.error is not None:
        return f"The environment ended the episode: {turn.error.detail}"
    return spec.step_message(turn.result, turn.parsed, turn.outcome, settings.max_observation_chars)


async def close_quietly(client: Any, state: str) -> None:
    """Free the simulator a finished episode holds (SciWorld's JVM) at once; a failure only costs the server's idle
    reaping, so it is logged, never raised."""
    try:
        await client.close(state)
    except Exception as error:  # best effort: the server reaps idle episodes anyway
        logger.warning("could not close a %s episode: %s", getattr(client, "env_id", "?"), error)


def _timer(metrics: MutableMapping[str, float] | None) -> Any:
    if metrics is None:
        return contextlib.nullcontext()
    from verl.utils.profiler import simple_timer

    return simple_timer("tool_calls", metrics)


#: The live episodes the fleet's simulators hold at once (``SCIWORLD_REPLICAS x SCIWORLD_MAX_LIVE_JVMS``; the compose
#: trainer job derives it from those two settings of .env, the one place they are set).
EPISODE_SLOTS_ENV = "AGENTRL_EPISODE_SLOTS"
_SLOTS: dict[str, asyncio.Semaphore] = {}


def slots_per_worker(total: int, workers: int) -> int:
    """One agent-loop worker process's share of ``total`` slots (at least one)."""
    return max(1, total // max(1, workers))


def episode_slot(spec: EnvSpec, trainer_config: Any = None) -> Any:
    """An async context manager that holds one of this process's slots for an episode of ``spec`` (a no-op for
    environments that hold no simulator, or without ``$AGENTRL_EPISODE_SLOTS``). The fleet's slots are shared out
    over verl's agent-loop worker processes (``rollout.agent.num_workers``), each a semaphore of its own."""
    total = os.environ.get(EPISODE_SLOTS_ENV, "").strip()
    if not spec.holds_simulator or not total:
        return contextlib.nullcontext()
    semaphore = _SLOTS.get(spec.env_id)
    if semaphore is None:
        workers = _select(trainer_config, "actor_rollout_ref.rollout.agent.num_workers", 1)
        share = slots_per_worker(int(total), int(workers))
        semaphore = _SLOTS[spec.env_id] = asyncio.Semaphore(share)
        logger.info("%s: at most %d live episodes in this worker process (%s of %s)", spec.env_id, share,
                    EPISODE_SLOTS_ENV, total)  # fmt: skip
    return semaphore


def _select(config: Any, key: str, default: Any) -> Any:
    node = config
    for part in key.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return default
    return node
