"""Old module names, kept for one release as deprecated aliases: the one import hook behind every renamed or moved
module of this repository.

The packages' old names (``webshop_env`` for ``agent_envs``, ``webshop_trainer`` for ``agent_trainer``: they serve
and train on every environment, not WebShop alone) and WebShop's parts from before they moved under
``agent_envs.envs.webshop`` (``agent_envs._moved``) and ``agent_trainer.envs.webshop`` (``agent_trainer._moved``:
its prompts, action parser and data builder) all register here. Importing an old name gives the very module
at the new one (the same objects, so ``isinstance`` checks, monkeypatches and a class that a config names by its old
dotted path reach the code that runs) with a DeprecationWarning that names the new one; ``python -m OLD`` runs the
new module. An old package keeps a directory of its own whose ``__init__`` calls :func:`alias_package`, so that it
is found before anything else is imported. A command's old name runs :func:`renamed_command`.

Aliases chain: ``webshop_env.core.env`` is ``agent_envs.core.env``, which is ``agent_envs.envs.webshop.core.env``
(and ``webshop_trainer.data`` is ``agent_trainer.data``, which is ``agent_trainer.envs.webshop.data``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping
from types import CodeType, ModuleType

#: old package or module -> (its new name, why it changed: the warning says it)
_ALIASES: dict[str, tuple[str, str]] = {}


def _alias(fullname: str) -> tuple[str, str] | None:
    """(the new name, why it changed) of a module known by an old name (``webshop_env.cli.main`` ->
    ``agent_envs.cli.main``), else None. The longest registered old name that is ``fullname`` or a package above
    it wins."""
    for old in sorted(_ALIASES, key=len, reverse=True):
        if fullname == old or fullname.startswith(old + "."):
            new, why = _ALIASES[old]
            return new + fullname[len(old) :], why
    return None


def _real_spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of the module that an old name stands for (the packages above it imported), else None."""
    alias = _alias(fullname)
    return importlib.util.find_spec(alias[0]) if alias is not None else None


def _warn(old: str, new: str, why: str, stacklevel: int) -> None:
    """The deprecation warning of an old name: the new name, and why it changed."""
    message = f"{old} is {new} now ({why}); the old name goes in the next release"
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a module by an old name and hands out the module at its new name (imported there, once)."""

    def __init__(self) -> None:
        self._real_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        real = _real_spec(fullname)
        if real is None:  # not an old name, or nothing at the new one: Python's own ImportError follows
            return None
        # a package's alias is a package (``python -m OLD`` runs its __main__), a module's is a module
        package = real.submodule_search_locations is not None
        return importlib.machinery.ModuleSpec(
            fullname, self, loader_state=_alias(fullname), is_package=package
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new, why = spec.loader_state
        _warn(spec.name, new, why, stacklevel=2)
        module = importlib.import_module(new)
        # importlib sets the alias spec on the module next: exec_module puts the real one back
        self._real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._real_specs.pop(module.__spec__.name, module.__spec__)

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code, for ``python -m OLD`` (runpy runs it as ``__main__``)."""
        real = _real_spec(fullname)
        get_code = getattr(real.loader, "get_code", None) if real is not None else None
        return get_code(real.name) if get_code is not None else None


def alias_modules(moved: Mapping[str, str], why: str) -> None:
    """Register old names (``{old: new}``, each with the modules below it) and put the hook first on
    ``sys.meta_path`` (once)."""
    _ALIASES.update({old: (new, why) for old, new in moved.items()})
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


def alias_package(old: str, new: str, why: str) -> None:
    """The whole of an old package's ``__init__``: ``import old`` gives the package ``new`` itself (a warning
    says so), and ``old.X`` the module ``new.X``."""
    alias_modules({old: new}, why)
    _warn(old, new, why, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)  # what the running ``import old`` hands out


def renamed_command(old: str, new: str, main: Callable[[], int]) -> int:
    """The entry point of a command's old name: one line on stderr that names the new command, then its ``main``."""
    print(
        f"{old} is deprecated: the command is {new} now (the old name goes in the next release)",
        file=sys.stderr,
    )
    return main()


def renamed_attributes(module: str, renamed: Mapping[str, str], why: str) -> Callable[[str], object]:
    """A module's ``__getattr__`` for its attributes' old names (old -> new, both in ``module``): the old name
    gives the very object at the new one (``except OldError`` still catches it), with the deprecation warning."""

    def __getattr__(name: str) -> object:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        _warn(f"{module}.{name}", f"{module}.{renamed[name]}", why, stacklevel=2)
        return getattr(sys.modules[module], renamed[name])

    return __getattr__
