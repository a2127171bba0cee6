"""A client that speaks to the service exactly as AgentGym's WebShop client does (shared by the integration
and fault tests; the root conftest puts this folder on sys.path)."""

from __future__ import annotations

import time
from typing import Any

import requests


class AgentGymClient:
    """The HTTP behaviour of AgentGym's ``agentenv.envs.webshop.WebshopEnvClient``, call for call.

    ``/create`` once (bare int id); ``_post`` injects ``env_idx`` and tries 5 times, sleeping 0.1 s after a
    503 and retrying at once after any other non-200; ``_get`` sends ``?env_idx=``; ``reset`` posts
    ``session_id`` then replaces the observation with ``GET /observation``; ``close`` posts ``{}``.
    """

    def __init__(self, env_server_base: str, timeout: int = 300) -> None:
        self.env_server_base = env_server_base
        self.timeout = timeout
        self.http = requests.Session()
        ok = self.http.post(f"{self.env_server_base}/create", timeout=self.timeout)
        if ok.status_code != 200:
            raise RuntimeError(f"Failed to create environment: {ok.status_code} {ok.text}")
        self.env_id = ok.json()

    def _post(self, path: str, data: dict[str, Any]) -> Any:
        data["env_idx"] = self.env_id
        for _ in range(5):
            res = self.http.post(f"{self.env_server_base}/{path}", json=data, timeout=self.timeout)
            if res.status_code == 503:
                time.sleep(0.1)
            elif res.status_code == 200:
                break
        assert res.status_code == 200, f"{path}: {res.status_code} {res.text}"
        return res.json()

    def _get(self, path: str) -> Any:
        res = self.http.get(f"{self.env_server_base}/{path}?env_idx={self.env_id}", timeout=self.timeout)
        assert res.status_code == 200, f"{path}: {res.status_code} {res.text}"
        return res.json()

    def observe(self) -> str:
        return self._get("observation")

    def step(self, action: str) -> tuple[str, float, bool]:
        if action.endswith("</s>"):
            action = action[: -len("</s>")]
        response = self._post("step", {"action": action})
        return response["state"], response["reward"], response["done"]

    def reset(self, idx: int) -> list:
        response = self._post("reset", {"session_id": idx})
        response[0] = self.observe()
        return response

    def close(self) -> Any:
        return self._post("close", {})
