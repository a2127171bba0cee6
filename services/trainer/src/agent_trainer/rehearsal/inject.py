"""Bugs put into a rehearsal on purpose, to prove that its checks see them (a test seam, nothing else uses it).

``AGENTRL_REHEARSAL_INJECT=<bug>[,<bug>...]`` (``make rehearse`` passes it on to every process of the run, whose
setup hook calls :func:`apply`); the rehearsal must then fail. The bugs, and the check that must catch each:

- ``reward_sign``: the reward's sign flipped where the agent loops hand it to verl (``WebShopAgentLoop``'s
  ``reward_score``; the interaction's turn reward on 0.7.1's ``tool_agent`` path), the env's own reward left as
  it was in the metrics -> ``reward_matches_env`` and ``update_direction``;
- ``mask_env_pages``: the loss mask set to 1 over the whole response, env pages included (both agent loops) ->
  ``loss_mask_is_model_tokens``;
- ``sync_skip``: the rollout adapter pushes nothing after the first weight sync (the rollout keeps generating
  with stale weights) -> ``weight_sync``;
- ``sync_partial``: every sync pushes all tensors but the MLP weights (a name-mapping regression) ->
  ``weight_sync``;
- ``sync_stale``: every sync after the first pushes the first sync's tensors again (all names, new version,
  old values) -> ``weight_sync`` (its log-prob comparison);
- ``reward_zero``: the reward zeroed where the agent loops hand it to verl (every environment's agent loop and
  the 0.7.1 interaction's turn reward), before the advantage -> ``make learn`` must report ``learned: false``
  (``agent_trainer.rehearsal.learn``: nothing to learn from), and the rehearsal's ``reward_matches_env``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

ENV = "AGENTRL_REHEARSAL_INJECT"
BUGS = ("reward_sign", "mask_env_pages", "sync_skip", "sync_partial", "sync_stale", "reward_zero")


def injected() -> list[str]:
    """The bugs named in ``$AGENTRL_REHEARSAL_INJECT`` (an unknown name is an error)."""
    names = [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(BUGS))
    if unknown:
        raise ValueError(f"{ENV}: unknown bug(s) {', '.join(unknown)}; known: {', '.join(BUGS)}")
    return names


def apply() -> list[str]:
    """Put the named bugs into this process (idempotent); returns their names."""
    names = injected()
    for name in names:
        globals()[f"_{name}"]()
    return names


#: Every replacement :func:`_once` made, in order: (class, attribute, the class's own value before it, or None
#: where it inherited the attribute).
_REPLACED: list[tuple[Any, str, Any]] = []


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """Every method a bug replaced inside the block put back as it was on leaving it (a test seam: tests inject
    bugs into their own process, which must not leak into the next test)."""
    mark = len(_REPLACED)
    try:
        yield
    finally:
        while len(_REPLACED) > mark:
            target, attribute, own = _REPLACED.pop()
            if own is not None:
                setattr(target, attribute, own)
            else:  # it was inherited: the parent's shows again
                delattr(target, attribute)


def _once(target: Any, attribute: str, make: Any, bug: str) -> None:
    """``target.attribute = make(original)``, once per bug (two bugs may wrap the same method)."""
    original = getattr(target, attribute)
    done = getattr(original, "agentrl_injected", frozenset())
    if bug in done:
        return
    patched = make(original)
    patched.agentrl_injected = done | {bug}
    _REPLACED.append((target, attribute, vars(target).get(attribute)))
    setattr(target, attribute, patched)


def _agent_loops() -> list[Any]:
    from ..agent_loop import WebShopAgentLoop

    loops = [WebShopAgentLoop]
    try:
        from ..tool_agent_loop import EnvToolAgentLoop
    except ImportError:  # verl >= 0.8 has no ToolAgentLoop interaction path
        return loops
    return [*loops, EnvToolAgentLoop]


def _reward_changed(bug: str, loop: type, change: Callable[[float], float]) -> None:
    """The episode's reward, as the agent loop reports it and as the 0.7.1 interaction scores each turn, replaced by
    ``change(reward)`` before the advantage (every other attribute of the turn reward kept)."""
    from ..interaction import BaseInteraction, EnvInteraction

    def run(original: Any) -> Any:
        @functools.wraps(original)
        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            output = await original(self, *args, **kwargs)
            if output.reward_score is not None:
                output.reward_score = change(float(output.reward_score))
            return output

        return wrapper

    def respond(original: Any) -> Any:
        @functools.wraps(original)
        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            done, message, score, metrics = await original(self, *args, **kwargs)
            rebuild, fields = score.__reduce__()  # every attribute the turn reward carries, its value changed
            return done, message, rebuild(change(float(score)), *fields[1:]), metrics

        return wrapper

    _once(loop, "run", run, bug)
    if (
        BaseInteraction is not object
    ):  # verl 0.7.x: the interaction exists (every environment's, WebShop's too)
        _once(EnvInteraction, "generate_response", respond, bug)


def _reward_sign() -> None:
    from ..agent_loop import WebShopAgentLoop

    _reward_changed("reward_sign", WebShopAgentLoop, lambda reward: -reward)


def _mask_env_pages() -> None:
    def run(original: Any) -> Any:
        @functools.wraps(original)
        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            output = await original(self, *args, **kwargs)
            output.response_mask = [1] * len(output.response_mask)
            return output

        return wrapper

    for loop in _agent_loops():
        _once(loop, "run", run, "mask_env_pages")


def _sync(bug: str, transform: Any) -> None:
    """Wrap the rollout adapter's ``update_weights`` with ``transform(adapter, weights) -> weights``; every rank
    still drains the actor's generator (gathering a sharded tensor is a collective)."""
    from .cpu_rollout import CpuServerAdapter

    def update(original: Any) -> Any:
        @functools.wraps(original)
        async def wrapper(self: Any, weights: Any, *args: Any, **kwargs: Any) -> Any:
            pushes = getattr(self, "_agentrl_pushes", 0)
            self._agentrl_pushes = pushes + 1
            replaced = transform(self, list(weights), pushes)
            if replaced is None:
                return None
            return await original(self, replaced, *args, **kwargs)

        return wrapper

    _once(CpuServerAdapter, "update_weights", update, bug)


def _sync_skip() -> None:
    _sync("sync_skip", lambda adapter, weights, pushes: weights if pushes == 0 else None)


def _sync_partial() -> None:
    _sync("sync_partial", lambda adapter, weights, pushes: [(n, t) for n, t in weights if ".mlp." not in n])


def _sync_stale() -> None:
    def transform(adapter: Any, weights: list[tuple[str, Any]], pushes: int) -> list[tuple[str, Any]]:
        if pushes == 0:
            adapter._agentrl_first = [(n, t.detach().clone()) for n, t in weights]
        return adapter._agentrl_first

    _sync("sync_stale", transform)


def _reward_zero() -> None:
    from ..agent_loop import EnvAgentLoop

    _reward_changed(
        "reward_zero", EnvAgentLoop, lambda reward: 0.0
    )  # WebShopAgentLoop inherits EnvAgentLoop.run
