"""SciWorld: ScienceWorld's elementary-science tasks (AgentGym's ``agentenv-sciworld``, 4,639 task variations).

``make()`` builds the core (``core.SciWorldEnv``) over a pool of JVMs (``pool``, sized by ``SCIWORLD_*``
environment variables) running the PyPI package ``scienceworld`` 1.2.3's simulator; ``AGENTGYM_ROUTES`` is
AgentGym's server for it (``agentgym``). See docs/environments/sciworld.md.
"""

from __future__ import annotations

import shutil
from typing import Any

from .agentgym import AGENTGYM_ROUTES
from .core import ActionFailed, EpisodeTooLong, SciWorldEnv
from .games import GAME_COUNT, game, python_index
from .pool import JvmPool, Simulator, SimulatorsBusy, SimulatorUnavailable


def check(settings: Any) -> list[str]:
    """What stops ``serve`` before a worker starts: no ``java`` on ``PATH`` to run the simulator's jar (py4j starts
    ``java``). Without this check the replica would come up and its pool keep trying, every SciWorld request
    answered 503 "retry shortly" for good."""
    if shutil.which("java") is None:
        return [
            "sciworld: no `java` on PATH: ScienceWorld's simulator is a Java program, checked on Java 17 "
            "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; or put a JDK 17's bin/ first on PATH)"
        ]
    return []


def make() -> SciWorldEnv:
    """The core with a pool sized from the environment; its spare JVMs start warming now, in the background."""
    env = SciWorldEnv(JvmPool.from_env())
    env.prewarm()
    return env


__all__ = [
    "AGENTGYM_ROUTES",
    "GAME_COUNT",
    "ActionFailed",
    "EpisodeTooLong",
    "JvmPool",
    "SciWorldEnv",
    "Simulator",
    "SimulatorUnavailable",
    "SimulatorsBusy",
    "check",
    "game",
    "make",
    "python_index",
]
