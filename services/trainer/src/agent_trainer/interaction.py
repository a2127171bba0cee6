"""The interaction of verl 0.7.x's ``ToolAgentLoop`` route: ``EnvInteraction`` (``BaseInteraction``), one episode of
any environment per trajectory, played through its spec.

How verl 0.7.1 drives it (``ToolAgentLoop``): one new agent loop, and so one new interaction object, per
trajectory, inside the agent-loop worker processes; ``start_interaction(request_id, **interaction_kwargs)``
once, then ``generate_response(request_id, messages, **interaction_kwargs)`` after every assistant turn (its
answer is appended to the token stream, the last one too); ``finalize_interaction`` is never called, and a
trajectory stopped by a turn or length limit simply ends.

So, in this module:

- construction is cheap: every interaction object of a process shares one pooled async HTTP client per
  environment (``episode.shared_client``);
- per-trajectory state is tiny (the env's signed state token plus counters, ``episode.Episode``) and lives in one
  process-wide registry keyed by instance id (``episode.EPISODES``); it is freed on ``done``, when the
  interaction object that opened it is garbage-collected (i.e. when verl drops the agent loop), by
  ``finalize_interaction``, and after an idle TTL;
- what a reply does to the episode (parse, step, outcome, score, next user turn) is ``agent_trainer.episode``'s,
  shared with the agent loop (``agent_loop.EnvAgentLoop``) and eval, so every route plays, scores and counts a
  reply the same way; the turn reward is its ``TurnScore``.

One ``interaction:`` entry per environment in ``configs/webshop_interaction.yaml``; ``ToolAgentLoop`` picks the
entry by the row's ``interaction_kwargs["name"]``, so one 0.7.1 run can mix environments. The episode ends where the
environment ends it, or after ``interaction_kwargs["max_rounds"]`` model turns, which
``tool_agent_loop.WebShopToolAgentLoop`` sets from the training config's ``environments.<env>.max_rounds``; an
environment the config has no block for is ended by verl's ``max_assistant_turns`` (WebShop's configs: 25, so 24
env steps and one last reply that is not played, as the guides run it).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

try:
    from verl.interactions.base import BaseInteraction
except ImportError:  # verl >= 0.8 removed interactions; the agent loop is the route there
    BaseInteraction = object  # type: ignore[assignment,misc]

from . import envs
from . import episode as episodes
from .config import InteractionSettings
from .envs import webshop
from .episode import (
    EPISODES,
    Episode,
    TurnScore,
    ensure_ready,
    last_assistant_text,
    message_text,
    shared_client,
)

logger = logging.getLogger(__name__)


def reached_rounds(steps: int, kwargs: Mapping[str, Any]) -> bool:
    """Whether an episode that has played ``steps`` model turns has used up its rounds: the row's
    ``max_rounds`` (set by ``WebShopToolAgentLoop`` from the training config's ``environments.<env>.max_rounds``);
    without one the interaction sets no limit of its own and verl's ``max_assistant_turns`` ends the episode."""
    rounds = kwargs.get("max_rounds")
    return rounds is not None and steps >= int(rounds)


class EnvInteraction(BaseInteraction):
    """verl 0.7.1 interaction that plays one episode of any environment per trajectory through its spec.

    Config (one ``interaction:`` entry per environment): ``env_id`` (a spec of ``agent_trainer.envs``; default
    the entry's ``name``) and any ``InteractionSettings`` field; unknown keys raise. The episode's rounds are the
    row's ``max_rounds`` (module docstring).

    The first user turn is the row's (``agent-train data --env``: the environment's own reset text for the task);
    the first reply checks that it is what the service shows for the row's task (``EnvSpec.checks_opening``), so
    rows built for another task, environment or version fail at once rather than train the model on a task it does
    not play.
    """

    #: The environment when the entry names none (``WebshopInteraction``: webshop).
    default_env_id: str | None = None

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        values = dict(config)
        env_id = values.pop("env_id", None) or self.default_env_id or values.get("name")
        if values.pop("max_rounds", None) is not None:
            raise ValueError(
                f"{env_id} interaction: max_rounds is not an interaction setting: an episode's length is the "
                f"training config's environments.{env_id}.max_rounds (default: the spec's rounds)"
            )
        self.spec = envs.get(str(env_id))
        self.settings = InteractionSettings.from_config(values)
        self.registry = EPISODES
        self._owned: set[str] = set()
        self._openings: dict[str, str] = {}  # instance id -> the first turn the service showed, until checked
        weakref.finalize(self, EPISODES.drop_many, self._owned)

    # ---- verl API --------------------------------------------------------------------------------------
    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Reset the environment on the row's task (``task``; WebShop: ``goal``); returns the instance id."""
        instance_id = instance_id or uuid4().hex
        task = self.spec.task_of(kwargs)
        options = self.spec.reset_kwargs(kwargs, self.settings.goal_set)
        self.registry.sweep(self.settings.state_ttl_s)
        client = shared_client(self.settings, self.spec)
        await ensure_ready(self.settings, client)
        first = await episodes.reset(self.spec, client, task, options)
        self.registry.put(instance_id, Episode(state=first["state"], goal=task, goal_set=options.get("goal_set"),
                                               split=kwargs.get("split") or None))  # fmt: skip
        self._owned.add(instance_id)
        if self.spec.checks_opening:
            self._openings[instance_id] = self.spec.first_message(first)
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """Play the last assistant message; returns ``(done, next user message, turn score, metrics)``."""
        episode = self.registry.get(instance_id)
        if episode is None:
            logger.warning("no %s episode for %s (expired after %.0f s idle, or already finished)",
                           self.spec.env_id, instance_id, self.settings.state_ttl_s)  # fmt: skip
            return (
                True,
                "The episode has expired.",
                TurnScore(0.0, done=True, stepped=False),
                {"expired": True},
            )
        opening = self._openings.pop(instance_id, None)
        if opening is not None:
            await self._check_opening(instance_id, episode, opening, messages)
        client = shared_client(self.settings, self.spec)
        try:
            turn = await episodes.play_turn(self.spec, self.settings, client, episode,
                                            last_assistant_text(messages), instance_id=instance_id)  # fmt: skip
        except BaseException:
            await self._finish(instance_id)
            raise
        done = turn.done or reached_rounds(episode.steps, kwargs)
        named = turn.parsed.action if turn.parsed.well_formed else None  # the action the reply named, if any
        metrics: dict[str, Any] = {"action": named, "valid": turn.outcome.valid, "steps": episode.steps,
                                   "invalid_actions": episode.invalid, "env_reward": turn.outcome.env_reward,
                                   "success": turn.outcome.success}  # fmt: skip
        if turn.error is not None:
            metrics["env_error"] = turn.error.error
        message = episodes.next_message(self.spec, turn, self.settings)
        if done:
            await self._finish(instance_id)
        return done, message, turn.score, metrics

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        """The episode's reward so far (the reward it would get if it ended now)."""
        episode = self.registry.get(instance_id) if instance_id else None
        return episode.reward if episode else 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        """Free one trajectory's state, or all of this object's when no id is given (0.7.1 never calls it)."""
        for owned in [instance_id] if instance_id is not None else list(self._owned):
            await self._finish(owned)

    # ---- helpers ---------------------------------------------------------------------------------------
    async def _check_opening(
        self, instance_id: str, episode: Episode, opening: str, messages: list[dict[str, Any]]
    ) -> None:
        shown = next((message_text(m) for m in messages if m.get("role") == "user"), None)
        if shown is None or shown.strip() == opening.strip():
            return
        await self._finish(instance_id)
        raise ValueError(
            f"{self.spec.env_id} task {episode.goal}: the row's first user turn is not what the environment shows "
            f"for this task (row: {shown[:120]!r}...; environment: {opening[:120]!r}...); the rows were built for "
            "another task, environment or version: rebuild them with `agent-train data --env "
            f"{self.spec.env_id}`"
        )

    async def _finish(self, instance_id: str) -> None:
        episode = self.registry.get(instance_id)
        self.registry.drop(instance_id)
        self._owned.discard(instance_id)
        self._openings.pop(instance_id, None)
        if self.spec.holds_simulator and episode is not None:
            await episodes.close_quietly(shared_client(self.settings, self.spec), episode.state)


class WebshopInteraction(EnvInteraction):
    """``EnvInteraction`` on WebShop (the name configs have always given WebShop's entry)."""

    default_env_id = webshop.ENV_ID

