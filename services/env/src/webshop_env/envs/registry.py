"""Environments by id: the one line to add for a new environment (docs/environments.md).

Each entry names a package that provides ``make() -> TextEnv`` (its pure core, built once per process) and
``AGENTGYM_ROUTES`` (its AgentGym server's routes; see ``contract``). Packages are imported on first use, so a
replica that serves only WebShop never imports minigrid or starts a JVM.
"""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType

from .contract import CompatRoute, TextEnv

REGISTRY: dict[str, str] = {
    "textcraft": "webshop_env.envs.textcraft",
    "babyai": "webshop_env.envs.babyai",
    "sciworld": "webshop_env.envs.sciworld",
}


class UnknownEnv(KeyError):
    def __str__(self) -> str:
        return f"unknown environment {self.args[0]!r}: the registered ones are {', '.join(ids())}"


def ids() -> list[str]:
    return list(REGISTRY)


def package(env_id: str) -> ModuleType:
    if env_id not in REGISTRY:
        raise UnknownEnv(env_id)
    return importlib.import_module(REGISTRY[env_id])


@cache
def make(env_id: str) -> TextEnv:
    """The environment's core, one per process (cores are immutable and serve every episode)."""
    return package(env_id).make()


def agentgym_routes(env_id: str) -> tuple[CompatRoute, ...]:
    return tuple(package(env_id).AGENTGYM_ROUTES)
