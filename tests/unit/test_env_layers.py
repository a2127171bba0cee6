"""WebShop is one environment package among others: the serving layer, the client and the deployment code name none,
WebShop's errors are the contract's, and the old module paths still give the moved modules (for one release)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "services" / "env" / "src" / "agent_envs"
#: The code that serves, reaches and deploys every environment alike.
GENERIC = [
    *sorted((PACKAGE / "api").glob("*.py")),
    *sorted((PACKAGE / "client").glob("*.py")),
    PACKAGE / "cluster.py",
    PACKAGE / "deploy.py",
    *(PACKAGE / "envs" / name for name in ("contract.py", "registration.py", "agentgym.py")),
]
#: The one place a generic module may name WebShop: the environment served when ``AGENTRL_ENVS`` names none.
ALLOWED = {("api/settings.py", "webshop")}


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append("." * node.level + node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_generic_code_names_no_environment(path: Path) -> None:
    """No branch on an environment's id and no import of an environment's package (each environment's traits
    come from its registration, its code through the registry)."""
    tree = ast.parse(path.read_text())
    where = str(path.relative_to(PACKAGE))
    ids = {"webshop", "textcraft", "babyai", "sciworld", "sokoban"}
    literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in ids}
    assert {(where, value) for value in literals} <= ALLOWED, literals
    packages = [name for name in _imports(tree) if any(f"envs.{env_id}" in name for env_id in ids)]
    assert not packages, packages


def test_webshops_errors_are_the_contracts() -> None:
    """One hierarchy: the HTTP layer answers WebShop's refusals with their own status and kind, as every
    environment's."""
    from agent_envs.api.errors import classify
    from agent_envs.envs import contract
    from agent_envs.envs.webshop.core.env import EnvError, EpisodeFinished, InvalidState, UnknownGoal
    from agent_envs.envs.webshop.textenv import GoalNotInSplit

    assert EnvError is contract.EnvError
    for error, parent, answer in (
        (UnknownGoal("x"), contract.UnknownTask, (404, "unknown_goal")),
        (GoalNotInSplit("x"), contract.UnknownTask, (404, "goal_not_in_split")),
        (EpisodeFinished("x"), contract.EpisodeOver, (409, "episode_finished")),
        (InvalidState("x"), contract.BadState, (400, "invalid_state")),
        (EnvError("x"), contract.EnvError, (400, "bad_request")),
    ):
        assert isinstance(error, parent) and classify(error) == answer


def test_the_client_hedges_as_each_registration_says() -> None:
    from agent_envs.client.envs import EnvClient
    from agent_envs.envs import registry

    for registration in registry.registrations().values():
        assert EnvClient("http://127.0.0.1:9", registration.id)._hedge is registration.hedge
    assert EnvClient("http://127.0.0.1:9", "sciworld")._hedge is False
    assert EnvClient("http://127.0.0.1:9", "not-registered-here")._hedge is True


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("agent_envs.core.env", "agent_envs.envs.webshop.core.env"),
        ("agent_envs.catalog.store", "agent_envs.envs.webshop.catalog.store"),
        ("agent_envs.search.kernels", "agent_envs.envs.webshop.search.kernels"),
        ("agent_envs.conformance.check", "agent_envs.envs.webshop.conformance.check"),
        ("agent_envs.api.routes_native", "agent_envs.envs.webshop.http.native"),
    ],
)
def test_old_module_paths_give_the_moved_modules(old: str, new: str) -> None:
    """In a fresh interpreter: the old name is the very module (its objects, its monkeypatches), with a
    DeprecationWarning that names the new path."""
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "assert old is new, (old, new)\n"
        f"assert any(w.category is DeprecationWarning and {new!r} in str(w.message) for w in seen), seen\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
