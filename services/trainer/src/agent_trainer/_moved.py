"""Old module paths of WebShop's trainer code, kept for one release: ``import agent_trainer.prompts`` still works.

WebShop's prompts, action parser and dataset builder were modules at the root of ``agent_trainer``; they are WebShop's
package now (``agent_trainer.envs.webshop``), one place like every other environment's module under ``envs``. Code
and users that import them by their old names (``agent_trainer.data``, or ``webshop_trainer.data``, the package's own
old name) get the very module at the new path (the same objects, so monkeypatches reach the code that runs), with a
DeprecationWarning naming the new path (``agent_envs.module_aliases``: the import hook of every old name).
``agent_trainer/__init__.py`` installs them, so they are in place before any old name is imported. The old names go
in the next release.
"""

from __future__ import annotations

from agent_envs.module_aliases import alias_modules

#: old module -> where it is now
MOVED: dict[str, str] = {
    "agent_trainer.prompts": "agent_trainer.envs.webshop.prompts",
    "agent_trainer.actions": "agent_trainer.envs.webshop.actions",
    "agent_trainer.data": "agent_trainer.envs.webshop.data",
}


def install() -> None:
    """Register the moved modules' old names with the import hook (once is enough; again is harmless)."""
    alias_modules(MOVED, why="WebShop's trainer code is one package, like every environment's")
