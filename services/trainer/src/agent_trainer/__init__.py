"""verl GRPO on the served text environments (WebShop, TextCraft, BabyAI, SciWorld); ``webshop_trainer`` is this
package's old name, an alias for one release.

Modules: ``envs`` (one spec per environment; ``envs.webshop`` is WebShop's package: its spec, ``prompts``, action
parser ``actions`` and parquet builder ``data``), ``interaction`` (WebshopInteraction), ``reward`` (verl custom
reward function), ``env_data`` (parquet rows of any environment or mix), ``preflight`` (CPU checks),
``tiny_model``, ``rehearsal`` (verl on CPU: the preflight's in-process workers and the whole training run,
``make rehearse``), ``cli`` (``agent-train``).
Heavy imports (verl, torch) happen in the modules that need them, not here.
"""

from agent_envs.setting_aliases import adopt_old_names as _adopt_old_setting_names

from ._moved import install as _install_moved_modules

__version__ = "0.1.0"

_adopt_old_setting_names()  # the settings' old names (WEBSHOP_*): AGENTRL_*, before any config reads one

_install_moved_modules()  # agent_trainer.prompts, .actions, .data: old names of envs.webshop's modules
