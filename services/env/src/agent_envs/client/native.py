"""Async client of WebShop's native protocol (``/v1/...``, its routes at the root): ``WebShopClient``.

The transport, retries, hedging and errors are every client's (``base.ServiceClient``); this is WebShop's protocol:
goals by index within a goal set and split, batches of steps, goal summaries, the expert by goal.

    async with WebShopClient("http://127.0.0.1:36003") as env:
        await env.wait_until_ready(60)
        first = await env.reset(1500, goal_set="human", split="train")
        step = await env.step(first["state"], "search[red shoes]")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..module_aliases import renamed_attributes
from .base import (
    DEFAULT_HEDGE_AFTER_S,
    ERRORS_RENAMED,
    OLD_ERROR_NAMES,
    ServiceClient,
    ServiceError,
    ServiceRequestError,
    ServiceUnavailable,
    retry_after_seconds,
)


class WebShopClient(ServiceClient):
    """Async client of ``/v1/...`` (the arguments are ``ServiceClient``'s)."""

    async def reset(self, goal: int, goal_set: str | None = None, split: str | None = None) -> dict[str, Any]:
        """``{observation, instruction, available_actions, state, info}`` of goal ``goal``'s first page."""
        body: dict[str, Any] = {"goal": goal}
        if goal_set is not None:
            body["goal_set"] = goal_set
        if split is not None:
            body["split"] = split
        return await self._request("POST", "/v1/reset", json=body, hedge=True)

    async def step(self, state: str, action: str) -> dict[str, Any]:
        """``{observation, reward, done, available_actions, state, info}`` after ``action``."""
        return await self._request("POST", "/v1/step", json={"state": state, "action": action}, hedge=True)

    async def step_batch(self, steps: Iterable[tuple[str, str] | Mapping[str, str]]) -> list[dict[str, Any]]:
        """Many steps in one request: ``(state, action)`` pairs or ``{"state", "action"}`` dicts.

        Returns one result per step, in order: a step result, or ``{"error", "detail", "status"}``.
        """
        items = [dict(s) if isinstance(s, Mapping) else {"state": s[0], "action": s[1]} for s in steps]
        return (await self._request("POST", "/v1/step_batch", json={"steps": items}))["results"]

    async def goals(self, goal_set: str | None = None, split: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("goal_set", goal_set), ("split", split)) if v is not None}
        return await self._request("GET", "/v1/goals", params=params)

    async def expert(self, goal: int, goal_set: str | None = None) -> list[str]:
        """The server's expert actions for ``goal`` (empty when it finds no way to the product)."""
        params = {"goal_set": goal_set} if goal_set is not None else {}
        return (await self._request("GET", f"/v1/goals/{int(goal)}/expert", params=params))["actions"]

    async def info(self) -> dict[str, Any]:
        return await self._request("GET", "/v1/info")


__all__ = [
    "DEFAULT_HEDGE_AFTER_S",
    "ServiceError",
    "ServiceRequestError",
    "ServiceUnavailable",
    "WebShopClient",
    "retry_after_seconds",
]

#: The errors' old names (``WebShopError``, ...), for one release (with a deprecation warning).
__getattr__ = renamed_attributes(__name__, OLD_ERROR_NAMES, ERRORS_RENAMED)
