"""Async client of any environment's native protocol through the contract's routes (``/<env>/v1/...``).

The transport, retries, back-off and address fallback are every client's (``base.ServiceClient``). Steps are
stateless for every environment; for one whose episodes sit in one replica's simulator (a sticky placement:
SciWorld's JVMs), the client also sends ``X-Episode`` so that the balancer keeps an episode on one replica (another
replica would have to replay it: correct, but seconds instead of milliseconds), and it never hedges a reset or
step on a slow address (the environment's registration says ``hedge=False``): the second replica would replay the
episode, doubling the load where the replica is slow because it is busy.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Any

from ..envs import registry
from .base import ServiceClient

MAX_TRACKED_EPISODES = 65_536  # states remembered for the X-Episode header (LRU)


def hedged(env_id: str) -> bool:
    """Whether a slow reset or step of ``env_id`` may be sent to a second address (its registration's ``hedge``;
    an environment this process does not know is hedged, as every stateless one is)."""
    try:
        return registry.registration(env_id).hedge
    except registry.UnknownEnv:
        return True


class EnvClient(ServiceClient):
    """``EnvClient(base_url, "textcraft")``: ``reset(task)``, ``step(state, action)``, ``expert(task)``,
    ``info()``, ``close(state)``; the other arguments are ``ServiceClient``'s."""

    def __init__(self, base_url: str, env_id: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.env_id = env_id
        self._hedge = hedged(env_id)
        self._episode_of: OrderedDict[str, str] = OrderedDict()

    async def reset(self, task: int) -> dict[str, Any]:
        """``{observation, reward, done, state, info}`` of task ``task``'s first step."""
        episode = secrets.token_hex(8)
        result = await self._request("POST", f"/{self.env_id}/v1/reset", json={"task": int(task)},
                                     headers={"X-Episode": episode}, hedge=self._hedge)  # fmt: skip
        self._remember(result, episode)
        return result

    async def step(self, state: str, action: str) -> dict[str, Any]:
        """``{observation, reward, done, state, info}`` after ``action``."""
        episode = self._episode_of.get(state) or secrets.token_hex(8)
        result = await self._request("POST", f"/{self.env_id}/v1/step", json={"state": state, "action": action},
                                     headers={"X-Episode": episode}, hedge=self._hedge)  # fmt: skip
        self._remember(result, episode)
        return result

    async def close(self, state: str) -> bool:
        """Free the simulator the episode holds, where the environment holds one (SciWorld); else False."""
        episode = self._episode_of.pop(state, None)
        headers = {"X-Episode": episode} if episode else {}
        result = await self._request(
            "POST", f"/{self.env_id}/v1/close", json={"state": state}, headers=headers
        )
        return bool(result["closed"])

    async def expert(self, task: int) -> list[str]:
        return (await self._request("GET", f"/{self.env_id}/v1/tasks/{int(task)}/expert"))["actions"]

    async def info(self) -> dict[str, Any]:
        return await self._request("GET", f"/{self.env_id}/v1/info")

    def _remember(self, result: dict[str, Any], episode: str) -> None:
        state = result.get("state")
        if isinstance(state, str):
            self._episode_of[state] = episode
            if len(self._episode_of) > MAX_TRACKED_EPISODES:
                self._episode_of.popitem(last=False)
