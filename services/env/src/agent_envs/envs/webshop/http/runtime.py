"""What WebShop's routes share in one worker: ``WebShopRuntime``, the serving layer's runtime of an environment
(token codec, session store) with WebShop's step counting and its answers' shapes.

Its tokens and sessions are those WebShop has always had: the token bound to the catalog's fingerprint alone, the
AgentGym sessions under the store's ``webshop:compat:`` keys, counted by the ``webshop_compat_sessions`` gauge.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request

from ....api.errors import ApiError
from ....api.metrics import Both, Metrics
from ....api.routes_envs import EnvRuntime
from ....api.settings import Settings
from ....api.tokens import TokenCodec
from ..core.env import EpisodeState, Step
from ..textenv import WebShopTextEnv

log = logging.getLogger("agent_envs.api")

ENV_ID = "webshop"
APIS = ("native", "compat")  # the ``api`` label of the step metrics
SESSION_PREFIX = "webshop:compat:"


def token_codec(secret: bytes, fingerprint: str) -> TokenCodec:
    """WebShop's state tokens for a catalog's fingerprint (what its runtime signs with)."""
    return TokenCodec(
        secret, fingerprint, WebShopTextEnv.state_to_json, WebShopTextEnv.state_from_json,
        data_name=WebShopTextEnv.data_name,
    )  # fmt: skip


class WebShopRuntime(EnvRuntime):
    """One worker's WebShop: the core over the opened catalog (``env``: ``WebShopTextEnv``), the codec, the
    sessions, and the step counters of the native and AgentGym routes."""

    env: WebShopTextEnv

    def __init__(self, env: WebShopTextEnv, settings: Settings, secret: bytes, metrics: Metrics) -> None:
        super().__init__(ENV_ID, env, settings, secret, metrics, session_prefix=SESSION_PREFIX,
                         on_sessions_change=metrics.compat_sessions.set)  # fmt: skip
        # agentrl_env_steps_total{env="webshop"}, and for one release its old name, webshop_env_steps_total{api}
        # (labels() locks on every call: the children are made once)
        self._steps_served = {
            api: Both(metrics.env_steps.new.labels(ENV_ID, api), metrics.old_webshop_steps.labels(api))
            for api in APIS
        }

    @property
    def catalog(self) -> Any:
        return self.env.catalog

    def step_limited(self, state: EpisodeState, action: str, api: str) -> tuple[Step, bool]:
        """(next step, truncated) with the step limit applied, counted."""
        step, truncated = self.env.step_limited(state, action)
        self._steps_served[api].inc()
        if step.done:
            self.metrics.finished.labels(api, "purchase").inc()
        elif truncated:
            self.metrics.finished.labels(api, "truncated").inc()
        return step, truncated

    # ---- native payloads -------------------------------------------------------------------------------
    def reset_payload(self, step: Step) -> dict[str, Any]:
        goal = self.env.sim.goal(step.state.goal_set, step.state.goal)
        return {
            "observation": step.observation,
            "instruction": step.instruction,
            "available_actions": step.available_actions,
            "state": self.codec.encode(step.state),
            # the category lets eval break results down without a copy of the catalog
            "info": {**step.info, "goal": goal.index, "goal_set": goal.goal_set, "category": goal.category},
        }

    def step_payload(self, step: Step, truncated: bool) -> dict[str, Any]:
        return {
            "observation": step.observation,
            "reward": step.reward,
            "done": step.done or truncated,
            "available_actions": step.available_actions,
            "state": self.codec.encode(step.state),
            "info": {**step.info, "truncated": truncated},
        }


def open_runtime(settings: Settings, secret: bytes, metrics: Metrics) -> WebShopRuntime:
    """The catalog opened (and its compiled search loaded before the first request, so ``/readyz`` says ready
    only then), the default goal sets checked against it."""
    from .. import make

    env = make(settings)
    catalog = env.catalog
    catalog.index.warm_up()
    for name, goal_set in (("DEFAULT_GOAL_SET", settings.default_goal_set),
                           ("COMPAT_GOAL_SET", settings.compat_goal_set)):  # fmt: skip
        if goal_set not in catalog.goal_sets:
            log.warning(
                f"WEBSHOP_{name}={goal_set!r} but this catalog has only {catalog.goal_sets}: requests that "
                "rely on the default will get 404 unknown_goal; set the variable to one of those"
            )
    log.info(
        "catalog open",
        extra={"fields": {"catalog": str(settings.catalog), "fingerprint": catalog.fingerprint,
                          "products": catalog.product_count, "goal_sets": catalog.goal_sets}},
    )  # fmt: skip
    return WebShopRuntime(env, settings, secret, metrics)


def runtime_of(request: Request) -> WebShopRuntime:
    """This worker's WebShop (503 ``not_ready`` before the catalog is open and while the worker drains)."""
    runtime = (getattr(request.app.state, "envs", None) or {}).get(ENV_ID)
    if runtime is None:
        raise ApiError(503, "not_ready", "the catalog is not open yet (or any more); retry shortly")
    return runtime
