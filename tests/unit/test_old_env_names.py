"""The env service's old names (package ``webshop_env``, command ``webshop-env``) still work for one release, as
deprecated aliases of ``agent_envs`` and ``agent-envs``, and say so (``agent_envs.module_aliases``, the hook that
the trainer's old names use too: tests/trainer/test_old_names.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter: nothing imported yet, so the old names are found the way a user's are."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_the_old_package_name_gives_the_same_modules_and_warns() -> None:
    result = _python(
        """
        import importlib, warnings
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            import webshop_env
            from webshop_env.envs import registry as old_registry
            old_main = importlib.import_module("webshop_env.cli.main")
            moved = importlib.import_module("webshop_env.core.env")  # moved under envs.webshop before the rename
        import agent_envs, agent_envs.cli.main, agent_envs.envs.webshop.core.env
        from agent_envs.envs import registry

        assert webshop_env is agent_envs and old_registry is registry
        assert old_main is agent_envs.cli.main and old_main.main is agent_envs.cli.main.main
        assert old_main.__spec__.name == "agent_envs.cli.main"  # the real module keeps its own spec
        assert moved is agent_envs.envs.webshop.core.env
        said = [str(w.message) for w in seen if w.category is DeprecationWarning]
        assert any(m.startswith("webshop_env is agent_envs now") for m in said), said
        assert any(m.startswith("webshop_env.cli.main is agent_envs.cli.main now") for m in said), said
        try:
            importlib.import_module("webshop_env.no_such_module")
        except ModuleNotFoundError as error:
            assert error.name == "webshop_env.no_such_module", error.name
        else:
            raise AssertionError("an old name of nothing imported")
        """
    )
    assert result.returncode == 0, result.stderr


def test_python_dash_m_runs_the_new_module_by_its_old_name() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "webshop_env.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "usage: agent-envs" in result.stdout


def test_the_old_command_runs_the_new_one_and_says_it_is_deprecated() -> None:
    old = Path(sys.executable).parent / "webshop-env"
    result = subprocess.run([str(old), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "webshop-env is deprecated: the command is agent-envs now (the old name goes in the next release)"
    ]
    assert "usage: agent-envs" in result.stdout


def test_the_clients_old_error_names_are_the_new_classes_and_warn() -> None:
    """``WebShopError``, ``WebShopUnavailable``, ``WebShopRequestError`` (every environment's client raised them) are
    ``ServiceError``, ... now: the old names give the very classes (so ``except WebShopUnavailable`` still catches
    what a TextCraft client raises), each with a deprecation warning naming the new one."""
    import warnings

    from agent_envs import client
    from agent_envs.client import base, native

    for module in (client, native, base):
        for old, new in (("WebShopError", "ServiceError"), ("WebShopUnavailable", "ServiceUnavailable"),
                         ("WebShopRequestError", "ServiceRequestError")):  # fmt: skip
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                found = getattr(module, old)
            assert found is getattr(base, new)
            assert any(w.category is DeprecationWarning and f".{new} now" in str(w.message) for w in seen), (
                old
            )
    try:
        raise base.ServiceUnavailable("down")
    except client.ServiceError as error:  # the hierarchy is unchanged
        assert isinstance(error, base.ServiceUnavailable)
