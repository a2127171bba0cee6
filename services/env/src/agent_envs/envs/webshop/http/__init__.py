"""WebShop's own protocol over HTTP: its HTTP side (``HTTP``), which its registration names and the serving layer
mounts at each of its prefixes (the root, as always, and ``/webshop``).

WebShop predates the contract's routes and keeps its wire protocol: the native routes (``native``: goals by index
within a goal set and a split, ``/v1/step_batch``, ``/v1/goals``, the expert by goal, a step fast path) and
AgentGym's WebShop server (``agentgym``: ``env_idx``, bare-int ``/create``, ``[observation, null]`` resets). Both
run on the serving layer's runtime (``runtime.WebShopRuntime``: tokens, sessions, limits, errors, metrics), so
what WebShop adds is its protocol and nothing else.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ....api.metrics import Metrics
from ....api.routes_envs import FastPath
from ....api.settings import Settings
from . import agentgym, native
from .runtime import WebShopRuntime, open_runtime, token_codec


class WebShopHttp:
    """``api.routes_envs.HttpSide`` for WebShop."""

    hot_paths = ("/v1/step", "/v1/step_batch", "/step")

    def runtime(self, env_id: str, settings: Settings, secret: bytes, metrics: Metrics) -> WebShopRuntime:
        return open_runtime(settings, secret, metrics)

    def routers(self, env_id: str, prefix: str) -> list[APIRouter]:
        mounted = APIRouter()
        mounted.include_router(native.router, prefix=prefix)
        mounted.include_router(agentgym.router, prefix=prefix)
        return [mounted]

    def fast_paths(
        self, env_id: str, prefix: str, recorder: Any, settings: Settings, metrics: Metrics
    ) -> list[FastPath]:
        return [native.StepFastPath(recorder, settings.max_body_bytes, f"{prefix}/v1/step")]


HTTP = WebShopHttp()

__all__ = ["HTTP", "WebShopHttp", "WebShopRuntime", "token_codec"]
