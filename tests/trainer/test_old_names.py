"""The trainer's old names (package ``webshop_trainer``, command ``webshop-train``) still work for one release, as
deprecated aliases of ``agent_trainer`` and ``agent-train``, and say so; so do the old paths of WebShop's modules
(``agent_trainer.prompts``, ``.actions``, ``.data``: ``agent_trainer.envs.webshop``'s now)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest


def test_the_old_package_name_gives_the_same_modules_and_warns() -> None:
    sys.modules.pop("webshop_trainer", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("webshop_trainer.agent_loop")
    new = importlib.import_module("agent_trainer.agent_loop")
    assert (
        old is new and old.EnvAgentLoop is new.EnvAgentLoop
    )  # a config naming the old path gets the same class
    assert old.__spec__.name == "agent_trainer.agent_loop"  # the real module keeps its own spec
    assert any("agent_trainer" in str(w.message) and w.category is DeprecationWarning for w in caught)
    # a class named by its old dotted path, as verl resolves an agent loop's _target_ from a config
    from hydra.utils import get_class

    assert get_class("webshop_trainer.agent_loop.EnvAgentLoop") is new.EnvAgentLoop


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("agent_trainer.prompts", "agent_trainer.envs.webshop.prompts"),
        ("agent_trainer.actions", "agent_trainer.envs.webshop.actions"),
        ("agent_trainer.data", "agent_trainer.envs.webshop.data"),
        # the package's old name, then the module's
        ("webshop_trainer.data", "agent_trainer.envs.webshop.data"),
    ],
)
def test_webshops_moved_modules_answer_to_their_old_paths_and_warn(old: str, new: str) -> None:
    """WebShop's prompts, action parser and data builder moved into its package (``agent_trainer.envs.webshop``):
    their old paths give the very modules (a monkeypatch through either reaches the code that runs), with a
    DeprecationWarning naming the new path."""
    for name in (old, old.replace("webshop_trainer", "agent_trainer")):
        sys.modules.pop(name, None)  # imported before (by another test): import it afresh, so it warns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
    assert moved.__spec__.name == new  # the real module keeps its own spec
    assert any(new in str(w.message) and w.category is DeprecationWarning for w in caught), [
        str(w.message) for w in caught
    ]


def test_the_old_command_runs_the_new_one_and_says_it_is_deprecated() -> None:
    old = Path(sys.executable).parent / "webshop-train"
    result = subprocess.run([str(old), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "agent-train" in result.stderr and "deprecated" in result.stderr
    assert "usage: agent-train" in result.stdout


def test_the_tool_agent_loops_old_class_name_is_the_class_and_warns() -> None:
    """``WebShopToolAgentLoop`` (it plays every environment: ``EnvToolAgentLoop`` now), as a config names it by its
    old dotted path: the very class, with a DeprecationWarning; any other missing name still raises."""
    pytest.importorskip("verl", reason="verl 0.7.1's ToolAgentLoop")
    from agent_trainer import tool_agent_loop

    with pytest.warns(DeprecationWarning, match="EnvToolAgentLoop"):
        old = tool_agent_loop.WebShopToolAgentLoop
    assert old is tool_agent_loop.EnvToolAgentLoop
    with pytest.raises(AttributeError):
        tool_agent_loop.NoSuchLoop  # noqa: B018
