"""One episode of any environment, one turn at a time: the per-episode code both verl routes and eval share.

``agent_loop.EnvAgentLoop`` (verl's agent-loop route, 0.7.1 and 0.9.1), ``interaction.EnvInteraction`` (verl
0.7.1's ``ToolAgentLoop`` + ``BaseInteraction`` route) and ``evaluation.runner`` differ only in who owns the token
stream (or the chat); what one reply does to the episode is decided here, once:

- :func:`reset`: the environment's first answer for a task, through its client (``EnvSpec.client``, with the
  spec's ``reset_kwargs``: WebShop's goal set and split);
- :func:`play_turn`: the reply parsed by the environment's spec (``EnvSpec.parse``), the action sent (or, for a
  reply AgentGym's client answers itself, nothing), the spec's ``Outcome``, and the turn's ``TurnScore``: what
  the episode's reward changed by (``env_reward`` so far minus what was paid before, less the invalid-reply
  penalty), so the turn scores of an episode sum to its reward, with the spec's success on every turn;
- :func:`next_message`: the spec's user turn for the environment's answer;
- :func:`episode_slot`: admission for an environment that holds a simulator per live episode (SciWorld's JVM):
  at most the fleet's simulators' worth of episodes at once, the others wait for a slot instead of evicting each
  other's simulators (each eviction costs a replay of seconds on the next step).

An episode's progress is an :class:`Episode` (the env's signed state token and counters, nothing else) in the
process's :data:`EPISODES` registry, which both routes use (the preflight checks it for leaks). Every HTTP call goes
through one pooled client per process, event loop, environment and settings (:func:`shared_client`): verl runs
many trajectories concurrently in each agent-loop worker process, and a blocking call would stall them all.

The turn's reward is a ``TurnScore``: a float (what verl sums and stores in ``turn_scores``) that also says whether
the reply was invalid and whether the episode ended. verl 0.7.1 drops the metrics that an interaction's
``generate_response`` returns, and ``turn_scores`` is the only per-turn channel that reaches the reward function
(``reward.compute_score``), which counts steps and invalid actions from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from webshop_env.client import WebShopRequestError

from .config import InteractionSettings
from .envs.spec import EnvSpec, Outcome, Parsed

logger = logging.getLogger(__name__)

#: What a step the environment refused means for the episode: it ends, unsolved, without an env step.
REFUSED = Outcome(env_reward=0.0, done=True, success=False, valid=False, finished=False)


class TurnScore(float):
    """A turn's reward, carrying what happened in that turn (it pickles across Ray processes).

    ``purchased``: the environment itself ended the episode on this turn (WebShop: a purchase); ``stepped``: the
    env took a step (False for a trajectory ended because its episode expired or the server refused it);
    ``success``: the episode is solved if it ends here, by its spec's rule (None: unknown, for a turn that played
    nothing; ``reward.episode_summary`` then applies WebShop's rule, the full reward).
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
            logger.info("dropped %d episode(s) idle for more than %.0f s", len(stale), ttl)
        return len(stale)

    def clear(self) -> None:
        """Forget every episode and reset the counters (tests and the preflight start from zero)."""
        self._episodes.clear()
        self.expired = self.opened = self.peak = 0


#: The registry of this process (all interaction objects share it; tests and the preflight inspect it).
EPISODES = EpisodeRegistry()

# One client per (event loop, settings): an httpx pool is bound to the loop it was first used on.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], Any]] = (
    weakref.WeakKeyDictionary()
)
_READY: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[str]] = weakref.WeakKeyDictionary()
_READY_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def env_urls(settings: InteractionSettings) -> list[str]:
    """Where this process reaches the env, in order of preference (``env: ray``: its own node's Serve proxy
    first, then the other nodes' proxies; ``env: http``: ``env_url``)."""
    if settings.env == "ray":
        from webshop_env.ray_serve.nodes import node_proxy_urls

        return node_proxy_urls(settings.ray_port)
    return [settings.env_url]


def shared_client(settings: InteractionSettings, spec: EnvSpec) -> Any:
    """The process's client of ``spec``'s environment for these settings on the running event loop (created on
    first use): ``spec.client`` (``/<env_id>/v1/...``; WebShop's own ``/v1``), every environment with the same
    retries, back-off and address fallback."""
    loop = asyncio.get_running_loop()
    key = (spec.env_id, settings.env, settings.env_url, settings.ray_port, settings.timeout, settings.retries,
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
        client = spec.client(urls[0], **options)
        clients[key] = client
    return client


async def close_shared_clients() -> None:
    """Close the running loop's clients (tests and the preflight call this before their loop ends)."""
    loop = asyncio.get_running_loop()
    for client in _CLIENTS.pop(loop, {}).values():
        await client.aclose()
    _READY.pop(loop, None)
    _READY_LOCKS.pop(loop, None)


async def ensure_ready(settings: InteractionSettings, client: Any) -> None:
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
                "is the env deployed on this Ray cluster? `webshop-env serve-ray`"
                if settings.env == "ray"
                else "set env_url in the interaction config or WEBSHOP_URL; `make up-local` starts one locally"
            )
            logger.warning(
                "waiting up to %.0f s for the env service at %s (%s)",
                settings.ready_timeout, " / ".join(client.urls), hint,
            )  # fmt: skip
            await client.wait_until_ready(settings.ready_timeout)
        ready.add(client.base_url)


@dataclass(frozen=True)
class Turn:
    """What one model reply did: the spec's reading of it, the environment's answer (``{}`` when nothing reached
    the environment), the spec's ``Outcome``, the turn's score and, for a step the server refused, its error."""

    parsed: Parsed
    result: Mapping[str, Any]
    outcome: Outcome
    score: TurnScore
    error: WebShopRequestError | None = None

    @property
    def done(self) -> bool:
        """The episode ends with this turn (the environment said so, or it refused the step)."""
        return self.outcome.done


async def reset(spec: EnvSpec, client: Any, task: int, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The environment's first answer for ``task``; ``options``: what else its reset takes
    (``EnvSpec.reset_kwargs``: WebShop's goal set and split)."""
    return await client.reset(task, **(options or {}))


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
        except WebShopRequestError as error:
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
EPISODE_SLOTS_ENV = "WEBSHOP_EPISODE_SLOTS"
_SLOTS: dict[str, asyncio.Semaphore] = {}


def slots_per_worker(total: int, workers: int) -> int:
    """One agent-loop worker process's share of ``total`` slots (at least one)."""
    return max(1, total // max(1, workers))


def episode_slot(spec: EnvSpec, trainer_config: Any = None) -> Any:
    """An async context manager that holds one of this process's slots for an episode of ``spec`` (a no-op for
    environments that hold no simulator, or without ``$WEBSHOP_EPISODE_SLOTS``). The fleet's slots are shared out
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


def message_text(message: Mapping[str, Any]) -> str:
    """A chat message's text, whether ``content`` is a string or a list of typed parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else str(part) for part in content
        )
    return "" if content is None else str(content)


def last_assistant_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last assistant message ('' when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return message_text(message)
    return ""
