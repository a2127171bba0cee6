"""``EnvInteraction``: verl 0.7.x's ``BaseInteraction`` over any environment the stateless service serves.

How verl 0.7.1 drives it (``ToolAgentLoop``): one new agent loop, and so one new interaction object, per
trajectory, inside the agent-loop worker processes; ``start_interaction(request_id, **interaction_kwargs)``
once, then ``generate_response(request_id, messages, **interaction_kwargs)`` after every assistant turn;
``finalize_interaction`` is never called, and a trajectory stopped by a turn or length limit simply ends.

So, in this module:

- construction is cheap: every interaction object of a process shares one pooled async HTTP client (per
  event loop and settings);
- per-trajectory state is tiny (the env's signed state token plus counters) and lives in one process-wide
  registry keyed by instance id; it is freed on ``done``, when the interaction object that opened it is
  garbage-collected (i.e. when verl drops the agent loop), by ``finalize_interaction``, and after an idle TTL;
- the turn reward is a ``TurnScore`` (``agent_trainer.episode``): a float (what verl sums and stores in
  ``turn_scores``) that also says whether the reply was invalid and whether the episode ended. verl 0.7.1 drops
  the metrics dict that ``generate_response`` returns, and ``turn_scores`` is the only per-turn channel that
  reaches the reward function (``reward.compute_score``), which counts steps and invalid actions from it.

One class for every environment the trainer has a spec for (``agent_trainer.envs``: WebShop, TextCraft, BabyAI,
SciWorld, installed packages'; ``WebshopInteraction`` is it on WebShop's spec), one entry per environment in
``configs/interaction.yaml``; ``ToolAgentLoop`` picks the
entry by the row's ``interaction_kwargs["name"]``, so one 0.7.1 run can mix environments. What a reply does to an
episode is ``agent_trainer.episode``'s, shared with the agent loop (``agent_loop.EnvAgentLoop``).

An episode ends after its rounds (model turns, each one env step): ``interaction_kwargs["max_rounds"]``, which
``tool_agent_loop.EnvToolAgentLoop`` puts on every row from ``turns.episode_rounds`` (the spec's rounds, or the
training config's ``environments.<env>.max_rounds``), so both verl paths play one episode length; without it (verl's
own ``ToolAgentLoop``) the spec's rounds. verl's ``max_assistant_turns`` only bounds it (the configs leave it one
more than the longest episode's rounds).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

try:
    from verl.interactions.base import BaseInteraction
except ImportError:
    # verl >= 0.8 removed interactions; the agent loop (agent_loop.py) still shares this module's client and
    # registry, so the module must import there (WebshopInteraction is unusable then).
    BaseInteraction = object  # type: ignore[assignment,misc]

from agent_envs.client import ServiceClient

from . import envs
from . import episode as episodes
from .config import InteractionSettings
from .envs.webshop import prompts
from .episode import Episode, TurnScore

logger = logging.getLogger(__name__)


class EpisodeRegistry:
    """Per-process map instance id -> Episode, with an idle TTL (verl never says when a trajectory ends)."""

    def __init__(self, sweep_interval: float = 10.0) -> None:
        self._episodes: dict[str, Episode] = {}
        self._sweep_interval = sweep_interval
        self._last_sweep = 0.0
        self.expired = 0
        self.opened = 0
        self.peak = 0

    def __len__(self) -> int:
        return len(self._episodes)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._episodes

    def ids(self) -> list[str]:
        return list(self._episodes)

    def put(self, instance_id: str, episode: Episode) -> None:
        episode.last_used = time.monotonic()
        self._episodes[instance_id] = episode
        self.opened += 1
        self.peak = max(self.peak, len(self._episodes))

    def get(self, instance_id: str) -> Episode | None:
        episode = self._episodes.get(instance_id)
        if episode is not None:
            episode.last_used = time.monotonic()
        return episode

    def drop(self, instance_id: str) -> bool:
        return self._episodes.pop(instance_id, None) is not None

    def drop_many(self, instance_ids: set[str]) -> int:
        dropped = sum(self.drop(i) for i in list(instance_ids))
        instance_ids.clear()
        return dropped

    def sweep(self, ttl: float, now: float | None = None, force: bool = False) -> int:
        """Drop episodes idle for more than ``ttl`` seconds (at most every ``sweep_interval`` unless forced)."""
        now = time.monotonic() if now is None else now
        if not force and now - self._last_sweep < self._sweep_interval:
            return 0
        self._last_sweep = now
        stale = [i for i, e in self._episodes.items() if now - e.last_used > ttl]
        for instance_id in stale:
            del self._episodes[instance_id]
        if stale:
            self.expired += len(stale)
            logger.info("dropped %d WebShop episode(s) idle for more than %.0f s", len(stale), ttl)
        return len(stale)

    def clear(self) -> None:
        """Forget every episode and reset the counters (tests and the preflight start from zero)."""
        self._episodes.clear()
        self.expired = self.opened = self.peak = 0


#: The registry of this process (all interaction objects share it; tests and the preflight inspect it).
EPISODES = EpisodeRegistry()

# One client per (event loop, settings): an httpx pool is bound to the loop it was first used on.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], ServiceClient]] = (
    weakref.WeakKeyDictionary()
)
_READY: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[str]] = weakref.WeakKeyDictionary()
_READY_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def env_urls(settings: InteractionSettings) -> list[str]:
    """Where this process reaches the env, in order of preference (``env: ray``: its own node's Serve proxy
    first, then the other nodes' proxies; ``env: http``: ``env_url``)."""
    if settings.env == "ray":
        from agent_envs.ray_serve.nodes import node_proxy_urls

        return node_proxy_urls(settings.ray_port)
    return [settings.env_url]


def shared_client(settings: InteractionSettings, env_id: str = envs.WEBSHOP) -> ServiceClient:
    """The process's client for these settings and environment on the running event loop (created on first use):
    the one the environment's spec names (``EnvSpec.client``: ``/<env_id>/v1/...`` on the balancer; WebShop's own
    ``/v1/...``), with the same retries, back-off and address fallback for every environment."""
    loop = asyncio.get_running_loop()
    key = (env_id, settings.env, settings.env_url, settings.ray_port, settings.timeout, settings.retries,
           settings.retry_budget_s, settings.backoff, settings.max_backoff, settings.max_connections)  # fmt: skip
    clients = _CLIENTS.setdefault(loop, {})
    client = clients.get(key)
    if client is None:
        urls = env_urls(settings)
        options: dict[str, Any] = dict(
            fallback_urls=urls[1:],
            timeout=settings.timeout,
            retries=settings.retries,
            retry_budget=settings.retry_budget_s,
            backoff=settings.backoff,
            max_backoff=settings.max_backoff,
            max_connections=settings.max_connections,
        )
        client = envs.get(env_id).client(urls[0], env_id, **options)
        clients[key] = client
    return client


async def close_shared_clients() -> None:
    """Close the running loop's clients (tests and the preflight call this before their loop ends)."""
    loop = asyncio.get_running_loop()
    for client in _CLIENTS.pop(loop, {}).values():
        await client.aclose()
    _READY.pop(loop, None)
    _READY_LOCKS.pop(loop, None)


async def ensure_ready(settings: InteractionSettings, client: ServiceClient) -> None:
    """Wait (once per process and URL) until the service answers; fail fast with a clear message."""
    loop = asyncio.get_running_loop()
    ready = _READY.setdefault(loop, set())
    if client.base_url in ready or settings.ready_timeout <= 0:
        return
    lock = _READY_LOCKS.setdefault(loop, asyncio.Lock())
    async with lock:
        if client.base_url in ready:
            return
        if not await client.health():
            hint = (
                "is the env deployed on this Ray cluster? `agent-envs serve-ray`"
                if settings.env == "ray"
                else "set env_url in the interaction config or AGENTRL_URL; `make up-local` starts one locally"
            )
            logger.warning(
                "waiting up to %.0f s for the WebShop service at %s (%s)",
                settings.ready_timeout, " / ".join(client.urls), hint,
            )  # fmt: skip
            await client.wait_until_ready(settings.ready_timeout)
        ready.add(client.base_url)


def reached_rounds(steps: int, kwargs: Mapping[str, Any], rounds: int) -> bool:
    """Whether an episode that has played ``steps`` model turns has used up its rounds: the row's ``max_rounds``
    (``EnvToolAgentLoop`` sets it on every row from ``turns.episode_rounds``), else ``rounds`` (the spec's)."""
    given = kwargs.get("max_rounds")
    return steps >= (rounds if given is None else int(given))


class EnvInteraction(BaseInteraction):
    """verl 0.7.1 interaction that plays one episode of any environment per trajectory through its spec.

    Config (one ``interaction:`` entry per environment): ``env_id`` (a spec of ``agent_trainer.envs``; default
    the entry's ``name``) and any ``InteractionSettings`` field; unknown keys raise. The episode's rounds are the
    row's ``max_rounds`` (``turns.episode_rounds``, put there by ``EnvToolAgentLoop``), else the spec's.

    The first user turn is the row's (``agent-train data --env``: the environment's own reset text for the task);
    the first reply checks that it is what the service shows for the row's task, so rows built for another task,
    environment or version fail at once rather than train the model on a task it does not play.
    """

    #: The environment when the config names none (``env_id``, else the entry's ``name``): WebShop's class sets it.
    default_env_id: str | None = None

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        values = dict(config)
        env_id = values.pop("env_id", None) or self.default_env_id or values.get("name")
        self.spec = envs.get(str(env_id))
        if (
            "max_rounds" in values
        ):  # the entry's own rounds, before the training config's override took their place
            raise ValueError(
                f"{self.spec.env_id} interaction: max_rounds is no longer an interaction setting; delete it from the "
                f"interaction config and set environments.{self.spec.env_id}.max_rounds in the training config (else "
                f"the spec's {self.spec.max_rounds})"
            )
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
        options = episodes.reset_options(self.spec, kwargs, self.settings)
        self.registry.sweep(self.settings.state_ttl_s)
        client = shared_client(self.settings, self.spec.env_id)
        await ensure_ready(self.settings, client)
        first = await episodes.reset(self.spec, client, task, options)
        self.registry.put(
            instance_id,
            Episode(
                state=first["state"], goal=task, goal_set=options.get("goal_set"), split=options.get("split")
            ),
        )
        self._owned.add(instance_id)
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
        client = shared_client(self.settings, self.spec.env_id)
        try:
            turn = await episodes.play_turn(self.spec, self.settings, client, episode,
                                            prompts.last_assistant_text(messages), instance_id=instance_id)  # fmt: skip
        except BaseException:
            await self._finish(instance_id)
            raise
        done = turn.done or reached_rounds(episode.steps, kwargs, self.spec.max_rounds)
        action = turn.parsed.action if turn.parsed.well_formed else None  # None: the reply named no action
        metrics: dict[str, Any] = {"action": action, "valid": turn.outcome.valid, "steps": episode.steps,
                                   "invalid_actions": episode.invalid, "env_reward": turn.outcome.env_reward,
                                   "success": turn.outcome.success,
                                   "truncated": bool((turn.result.get("info") or {}).get("truncated"))}  # fmt: skip
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
        shown = next((prompts.message_text(m) for m in messages if m.get("role") == "user"), None)
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
            await episodes.close_quietly(shared_client(self.settings, self.spec.env_id), episode.state)


class WebshopInteraction(EnvInteraction):
    """WebShop's entry (``configs/interaction.yaml``, the name verl's guides use): ``EnvInteraction`` on
    the WebShop spec (its prompts, parser, goal sets and splits), as ``WebShopAgentLoop`` is ``EnvAgentLoop``."""

    default_env_id = envs.WEBSHOP
