"""``webshop_trainer``: the trainer's old name, kept for one release. The package is ``agent_trainer`` now (it trains
on every served environment, not WebShop alone), and the command ``agent-train``.

``import webshop_trainer.X`` gives the very module ``agent_trainer.X`` (same objects, so a class named by its old
path in a config, e.g. ``webshop_trainer.agent_loop.EnvAgentLoop``, is the class verl registers), with a
DeprecationWarning saying the new name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

OLD, NEW = "webshop_trainer", "agent_trainer"

warnings.warn(
    f"the {OLD} package is now {NEW} (and the webshop-train command agent-train); the old names go in the next release",
    DeprecationWarning,
    stacklevel=2,
)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``webshop_trainer.X`` as ``agent_trainer.X`` and hands out that module itself."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(OLD + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(NEW + spec.name[len(OLD) :])
        self._real_spec = module.__spec__  # importlib sets the alias spec on it next: put the real one back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._real_spec


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())

_new = importlib.import_module(NEW)
globals().update({name: value for name, value in vars(_new).items() if not name.startswith("__")})
