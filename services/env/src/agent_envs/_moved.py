"""Old module paths of code that moved, kept for one release: ``import agent_envs.core.env`` still works.

WebShop's simulator, search, catalog and conformance tools were packages at the root of ``agent_envs``, and its
routes modules of the serving layer; they are WebShop's environment package now (``agent_envs.envs.webshop``),
beside TextCraft's, BabyAI's and SciWorld's. Code
and users that import them by their old names (the trainer, scripts, notebooks) get the very module at the new path
(the same objects, so ``isinstance`` checks and monkeypatches reach the code that runs), with a DeprecationWarning
naming the new path (``module_aliases``: the import hook of every old name). ``agent_envs/__init__.py`` installs
them, so they are in place before any old name is imported. The old names go in the next release.
"""

from __future__ import annotations

from .module_aliases import alias_modules

#: old package or module -> where it is now
MOVED: dict[str, str] = {
    "agent_envs.core": "agent_envs.envs.webshop.core",
    "agent_envs.search": "agent_envs.envs.webshop.search",
    "agent_envs.catalog": "agent_envs.envs.webshop.catalog",
    "agent_envs.conformance": "agent_envs.envs.webshop.conformance",
    # WebShop's own routes (its protocol), mounted by the serving layer as its registration asks
    "agent_envs.api.routes_native": "agent_envs.envs.webshop.http.native",
    "agent_envs.api.routes_compat": "agent_envs.envs.webshop.http.agentgym",
}


def install() -> None:
    """Register the moved modules' old names with the import hook (once is enough; again is harmless)."""
    alias_modules(MOVED, why="WebShop is one environment package among others")
