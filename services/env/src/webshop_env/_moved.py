"""Old module paths of code that moved, kept for one release: ``import webshop_env.core.env`` still works.

WebShop's simulator, search, catalog and conformance tools were packages at the root of ``webshop_env``, and its
routes modules of the serving layer; they are WebShop's environment package now (``webshop_env.envs.webshop``),
beside TextCraft's, BabyAI's and SciWorld's. Code
and users that import them by their old names (the trainer, scripts, notebooks) get the very module at the new path
(the same objects, so ``isinstance`` checks and monkeypatches reach the code that runs), with a DeprecationWarning
naming the new path. ``webshop_env/__init__.py`` installs the finder, so it is in place before any old name is
imported. The old names go in the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

#: old package or module -> where it is now
MOVED: dict[str, str] = {
    "webshop_env.core": "webshop_env.envs.webshop.core",
    "webshop_env.search": "webshop_env.envs.webshop.search",
    "webshop_env.catalog": "webshop_env.envs.webshop.catalog",
    "webshop_env.conformance": "webshop_env.envs.webshop.conformance",
    # WebShop's own routes (its protocol), mounted by the serving layer as its registration asks
    "webshop_env.api.routes_native": "webshop_env.envs.webshop.http.native",
    "webshop_env.api.routes_compat": "webshop_env.envs.webshop.http.agentgym",
}


def new_name(fullname: str) -> str | None:
    """The current name of a module known by an old one (``webshop_env.core.env`` -> ...), else None."""
    for old, new in MOVED.items():
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old) :]
    return None


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved module by its old name and hands out the module at its new name."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_name(spec.name)
        assert new is not None
        warnings.warn(
            f"{spec.name} moved to {new} (WebShop is one environment package among others); the old name goes "
            "in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        # importlib sets the alias spec on the module next: exec_module puts the real one back
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
