"""The `agent-envs` command line: episodes as JSON lines, the expert, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "agent_envs.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_solve_then_replay_the_actions_as_an_episode(conformance_catalog_dir: Path) -> None:
    solved = run_cli(
        "solve", "--catalog", str(conformance_catalog_dir), "--goal", "12", "--goal-set", "human"
    )
    assert solved.returncode == 0, solved.stderr
    actions = solved.stdout.split("\n")[:-1]
    assert actions[0].startswith("search[") and actions[-1] == "click[buy now]"
    arguments = ["episode", "--catalog", str(conformance_catalog_dir), "--goal", "12", "--goal-set", "human"]
    for action in actions:
        arguments += ["--action", action]
    episode = run_cli(*arguments, "--json")
    assert episode.returncode == 0, episode.stderr
    lines = [json.loads(line) for line in episode.stdout.splitlines()]
    assert set(lines[0]) == {"observation", "instruction", "available_actions"}
    assert [line["action"] for line in lines[1:]] == actions
    assert lines[-1]["done"] is True and lines[-1]["reward"] == 1.0
    assert lines[-1]["info"]["reward_info"]["r_type"] == 1.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--goal", "100000"], "out of range"),
        (["--goal", "0", "--goal-set", "human", "--catalog", "/nonexistent"], "not a prepared catalog"),
    ],
)
def test_errors_are_one_clear_line(conformance_catalog_dir: Path, args: list[str], message: str) -> None:
    if "--catalog" not in args:
        args = [*args, "--catalog", str(conformance_catalog_dir)]
    result = run_cli("episode", *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("products", ["-5", "0"])
def test_generate_refuses_fewer_than_one_product(tmp_path: Path, products: str) -> None:
    result = run_cli("catalog", "generate", "--products", products, "--out", str(tmp_path / "raw"), "--quiet")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"agent-envs catalog generate: error: --products must be at least 1 (got {products})"
    )
    assert not (tmp_path / "raw").exists()  # nothing written that `catalog prepare` would then reject


def test_help_explains_every_command() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("catalog", "episode", "play", "solve", "bench", "serve", "bench-http"):
        assert command in result.stdout


def test_play_reads_actions_from_the_terminal(conformance_catalog_dir: Path) -> None:
    solved = run_cli("solve", "--catalog", str(conformance_catalog_dir), "--goal", "3", "--goal-set", "human")
    actions = solved.stdout.split("\n")[:-1]
    command = [
        sys.executable,
        "-m",
        "agent_envs.cli.main",
        "play",
        "--catalog",
        str(conformance_catalog_dir),
    ]
    played = subprocess.run(
        [*command, "--goal", "3", "--goal-set", "human"],
        input="click[nothing here]\n" + "\n".join(actions) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert played.returncode == 0, played.stderr
    assert "(invalid action: nothing happens)" in played.stdout
    assert "Thank you for shopping with us!" in played.stdout
    assert "reward 1.0" in played.stdout


def test_serve_module_does_not_import_the_cli_entry_point() -> None:
    """cli/main.py imports cli/serve.py to register its commands; the reverse would be an import cycle."""
    probe = "import sys, agent_envs.cli.serve; print('agent_envs.cli.main' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    done = subprocess.run([sys.executable, "-m", "agent_envs.cli", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "conformance" in done.stdout and "serve" in done.stdout
