"""``WebAgentTextEnv`` with the original's public shape, backed by this project's ``WebShopEnv``."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from web_agent_site import utils


class WebAgentTextEnv:
    def __init__(self, observation_mode: str = "html", file_path: str | None = None, **kwargs: Any) -> None:
        from agent_envs.envs.webshop.catalog.store import open_catalog
        from agent_envs.envs.webshop.conformance.adapter import goal_as_original
        from agent_envs.envs.webshop.core.env import WebShopEnv

        assert observation_mode == "text", observation_mode
        assert Path(os.getcwd(), "search_engine").is_dir(), "the original runs from its checkout"
        for path in (file_path, utils.DEFAULT_FILE_PATH, utils.DEFAULT_ATTR_PATH, utils.HUMAN_ATTR_PATH):
            assert Path(path).is_file(), f"data path not pointed at the raw files: {path}"
        catalog = open_catalog(os.environ["WEBSHOP_SHIM_CATALOG"])
        self._env = WebShopEnv(catalog)
        self._goal_set = "human" if kwargs.get("human_goals") else "synthetic"
        products = [catalog.product(i) for i in range(catalog.product_count)]
        self.server = SimpleNamespace(
            goals=[
                goal_as_original(catalog.goal(self._goal_set, i))
                for i in range(catalog.goal_count(self._goal_set))
            ],
            product_prices={p.asin: p.price for p in products},
            all_products=[{"asin": p.asin, "Title": p.title} for p in products],
            user_sessions={},
        )
        self.session: str | None = None
        self._step: Any = None

    def reset(self, session: int | None = None) -> tuple[str, None]:
        self.session = str(session)
        self.server.user_sessions[self.session] = {}
        self._step = self._env.reset(session, goal_set=self._goal_set)
        return self._step.observation, None

    def step(self, action: str) -> tuple[str, float, bool, None]:
        self._step = self._env.step(self._step.state, action)
        if "reward_info" in self._step.info:
            self.server.user_sessions[self.session]["verbose_info"] = self._step.info["reward_info"]
        return self._step.observation, self._step.reward, self._step.done, None

    def get_available_actions(self) -> dict[str, Any]:
        return self._step.available_actions
