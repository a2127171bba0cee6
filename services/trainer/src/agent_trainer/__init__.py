"""verl GRPO on the served text environments (WebShop, TextCraft, BabyAI, SciWorld); ``webshop_trainer`` is this
package's old name, an alias for one release.

Modules: ``interaction`` (WebshopInteraction), ``actions`` (action extraction), ``prompts`` (every text the
policy sees), ``reward`` (verl custom reward function), ``data`` (parquet builder), ``preflight`` (CPU checks),
``tiny_model``, ``rehearsal`` (verl on CPU: the preflight's in-process workers and the whole training run,
``make rehearse``), ``cli`` (``agent-train``).
Heavy imports (verl, torch) happen in the modules that need them, not here.
"""

from agent_envs.setting_aliases import adopt_old_names as _adopt_old_setting_names

__version__ = "0.1.0"

_adopt_old_setting_names()  # the settings' old names (WEBSHOP_*): AGENTRL_*, before any config reads one
