"""BabyAI: the 40 BabyAI levels of AgentGym's ``agentenv-babyai`` behind its text wrapper, on minigrid 2.3.1.

``make()`` builds the pure core (``core.BabyAI``); ``AGENTGYM_ROUTES`` is AgentGym's server for it
(``agentgym``). See docs/environments/babyai.md.
"""

from .agentgym import AGENTGYM_ROUTES
from .core import ActionRefused, BabyAI, TooManySteps, make

__all__ = ["AGENTGYM_ROUTES", "ActionRefused", "BabyAI", "TooManySteps", "make"]
