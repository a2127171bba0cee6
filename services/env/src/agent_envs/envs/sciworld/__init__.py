"""SciWorld: ScienceWorld's elementary-science tasks (AgentGym's ``agentenv-sciworld``, 4,639 task variations).

``make()`` builds the core (``core.SciWorldEnv``) over a pool of JVMs (``pool``, sized by ``SCIWORLD_*``
environment variables) running the PyPI package ``scienceworld`` 1.2.3's simulator; ``AGENTGYM_ROUTES`` is
AgentGym's server for it (``agentgym``). See docs/environments/sciworld.md.
"""

from __future__ import annotations

from .agentgym import AGENTGYM_ROUTES
from .core import ActionFailed, EpisodeTooLong, SciWorldEnv
from .games import GAME_COUNT, game, python_index
from .pool import JvmPool, Simulator, SimulatorsBusy, SimulatorUnavailable


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
    "game",
    "make",
    "python_index",
]
