"""The trainer's old names (package ``webshop_trainer``, command ``webshop-train``) still work for one release, as
deprecated aliases of ``agent_trainer`` and ``agent-train``, and say so."""

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
