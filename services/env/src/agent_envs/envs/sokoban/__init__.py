"""Sokoban: push the box onto the target in a 6x6 room, as RAGEN and verl-agent train on it (gym-sokoban's rooms).

``make()`` builds the pure core (``core.Sokoban``); the rooms come from the PyPI package ``gym-sokoban`` (its room
generator only, ``rooms``). AgentGym has no server for Sokoban, so there are no AgentGym routes
(``AGENTGYM_ROUTES`` is empty): the native protocol and OpenEnv's serve it. See docs/environments/sokoban.md.
"""

from ..contract import CompatRoute
from .core import ACTIONS, ActionRefused, Sokoban, make

#: AgentGym has no Sokoban server: none of its routes.
AGENTGYM_ROUTES: tuple[CompatRoute, ...] = ()

__all__ = ["ACTIONS", "AGENTGYM_ROUTES", "ActionRefused", "Sokoban", "make"]
