"""The settings' old names (``WEBSHOP_*``, now ``AGENTRL_*``) keep working for one release, each with a deprecation
line, wherever a user sets them: the shell of a Python entry point, make, an old ``.env`` that compose reads, the
Slurm job; WebShop's own settings keep their names (``agent_envs.setting_aliases``, docs/configuration.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from agent_envs.setting_aliases import WEBSHOP_OWN, adopt_old_names, new_name

REPO = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = REPO / ".env.example"
SBATCH = REPO / "deploy" / "slurm" / "agent-grpo.sbatch"


def _clean_env(**settings: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_", "MAKE", "MFLAGS"))
    }
    return {**env, **settings}


def test_an_old_name_moves_to_its_new_one_and_leaves_the_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    environ = {"WEBSHOP_ENVS": "babyai", "WEBSHOP_STATE_SECRET": "s3cret-value-never-printed", "PATH": "/bin"}
    moved = adopt_old_names(environ)
    assert moved == {"WEBSHOP_ENVS": "AGENTRL_ENVS", "WEBSHOP_STATE_SECRET": "AGENTRL_STATE_SECRET"}
    assert environ == {
        "AGENTRL_ENVS": "babyai",
        "AGENTRL_STATE_SECRET": "s3cret-value-never-printed",
        "PATH": "/bin",
    }
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "deprecated" in err and "WEBSHOP_ENVS -> AGENTRL_ENVS" in err
    assert "s3cret" not in err  # names only, never a value


def test_the_new_name_wins_and_webshops_own_settings_stay(capsys: pytest.CaptureFixture[str]) -> None:
    environ = {"WEBSHOP_PORT": "1", "AGENTRL_PORT": "2", "WEBSHOP_CATALOG": "/c", "WEBSHOP_MAX_STEPS": "9"}
    adopt_old_names(environ)
    assert environ == {"AGENTRL_PORT": "2", "WEBSHOP_CATALOG": "/c", "WEBSHOP_MAX_STEPS": "9"}
    assert "ignored, their new names are set too: WEBSHOP_PORT" in capsys.readouterr().err
    assert adopt_old_names({"AGENTRL_ENVS": "webshop"}) == {}
    assert all(new_name(own) is None for own in WEBSHOP_OWN)


def test_webshops_own_settings_are_read_by_their_names() -> None:
    """The service reads WebShop's settings as WEBSHOP_* and the rest as AGENTRL_*; a value passed by field name
    wins over the variable, as it does for every other field."""
    code = ("from agent_envs.api.settings import Settings as S; s = S(); "
            "print(s.envs, s.catalog, s.max_batch, s.max_steps, s.log_level, S(max_batch=3).max_batch)")  # fmt: skip
    env = _clean_env(AGENTRL_ENVS="textcraft", WEBSHOP_CATALOG="/cat", WEBSHOP_MAX_BATCH="7",
                     WEBSHOP_MAX_STEPS="11", WEBSHOP_LOG_LEVEL="DEBUG")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["textcraft", "/cat", "7", "11", "DEBUG", "3"]
    assert "WEBSHOP_LOG_LEVEL -> AGENTRL_LOG_LEVEL" in result.stderr


def test_a_replica_started_with_the_old_names_serves_what_they_say(tmp_path: Path) -> None:
    """``agent-envs serve`` under the shell of an old deployment: WEBSHOP_ENVS picks what it serves, WEBSHOP_PORT
    where, WEBSHOP_ALLOW_EPHEMERAL_SECRET lets it start; one deprecation line."""
    port = _free_port()
    env = _clean_env(WEBSHOP_ENVS="babyai", WEBSHOP_PORT=str(port), WEBSHOP_ALLOW_EPHEMERAL_SECRET="1",
                     WEBSHOP_WATCHDOG_INTERVAL_S="0", WEBSHOP_HOST="127.0.0.1")  # fmt: skip
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "agent_envs.cli", "serve", "--workers", "1"],
                                  stdout=out, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        info = _wait_json(f"http://127.0.0.1:{port}/babyai/v1/info", server, log)
        assert info["env"] == "babyai" and info["tasks"] > 0, info
        assert requests.get(f"http://127.0.0.1:{port}/textcraft/v1/info", timeout=10).status_code == 404
    finally:
        server.terminate()
        server.wait(30)
    text = log.read_text()
    assert text.count("deprecated setting names") == 1, text[-3000:]
    assert "WEBSHOP_ENVS -> AGENTRL_ENVS" in text


def test_make_takes_an_old_name_from_the_shell_and_the_command_line() -> None:
    for how in ("shell", "command line"):
        env = _clean_env(**({"WEBSHOP_PORT": "41234"} if how == "shell" else {}))
        args = ["make", "-n", "-s", "up-local", *(["WEBSHOP_PORT=41234"] if how == "command line" else [])]
        result = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
        assert result.returncode == 0, result.stderr
        assert re.search(r"agent_envs\.cluster up .*--port 41234\b", result.stdout), (
            how,
            result.stdout[-2000:],
        )
        assert "deprecated setting names" in result.stderr and "WEBSHOP_PORT -> AGENTRL_PORT" in result.stderr
    result = subprocess.run(["make", "-n", "-s", "up-local"], capture_output=True, text=True, env=_clean_env(),
                            cwd=REPO, timeout=120)  # fmt: skip
    assert "--port 36003" in result.stdout and "deprecated setting names" not in result.stderr


def _old_env_file(new_file: Path, old_file: Path, **changes: str) -> None:
    """``new_file``'s settings under their old names (WebShop's own as they are), with ``changes``."""
    lines = []
    for line in new_file.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            key = "WEBSHOP_" + key[len("AGENTRL_") :] if key.startswith("AGENTRL_") else key
            value = changes.pop(key, value)
        lines.append(f"{key}{sep}{value}")
    old_file.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in changes.items())]) + "\n")


def test_compose_reads_an_old_env_file_as_the_new_one(compose: Any, tmp_path: Path) -> None:
    """An .env from before the rename renders the very stack the new one does, and its values are used."""

    def render(env_file: Path) -> dict:
        return compose.config(*compose.all_profiles, env_file=env_file, secret=False)

    new = tmp_path / "new.env"
    new.write_text(
        ENV_EXAMPLE.read_text().replace("AGENTRL_STATE_SECRET=\n", f"AGENTRL_STATE_SECRET={compose.secret}\n")
    )
    old = tmp_path / "old.env"
    _old_env_file(new, old)
    assert not re.search(r"^AGENTRL_", old.read_text(), re.M) and re.search(
        r"^WEBSHOP_ENVS=", old.read_text(), re.M
    )
    assert render(old) == render(new)

    _old_env_file(new, old, WEBSHOP_REPLICAS="3", WEBSHOP_WORKERS="8", WEBSHOP_ENVS="babyai", WEBSHOP_PORT="40000",
                  WEBSHOP_MAX_STEPS="12")  # fmt: skip
    services = render(old)["services"]
    assert services["envs"]["deploy"]["replicas"] == 3
    environment = services["envs"]["environment"]
    assert (environment["AGENTRL_WORKERS"], environment["AGENTRL_ENVS"]) == ("8", "babyai")
    assert environment["AGENTRL_STATE_SECRET"] == compose.secret and environment["WEBSHOP_MAX_STEPS"] == "12"
    assert services["balancer"]["ports"][0]["published"] == "40000"


def test_every_setting_compose_reads_falls_back_to_its_old_name() -> None:
    """compose.yaml, and the compose file `make ... DEVICE=cpu` writes over it."""
    from agent_trainer.gpu_plan import cpu_compose_override

    text = (REPO / "compose.yaml").read_text() + cpu_compose_override("base:tag")
    reads = re.findall(r"(?<!\$)\$\{(AGENTRL_[A-Z0-9_]+)(.{0,40})", text)
    assert reads
    for name, after in reads:
        assert after.startswith(f":-${{WEBSHOP_{name[len('AGENTRL_') :]}"), (name, after)


def test_the_slurm_job_moves_the_old_names(tmp_path: Path) -> None:
    """The job script's own lines (cut from it and run as they are) under a shell with old names."""
    lines = SBATCH.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# The settings' old names"))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith('[[ -z "$renamed" ]]'))
    script = tmp_path / "shim.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(lines[start : end + 1])
                      + "\nenv | grep -E '^(WEBSHOP|AGENTRL)_' | sort\n")  # fmt: skip
    env = _clean_env(
        WEBSHOP_TRAIN_ENVS="textcraft", WEBSHOP_CATALOG="/c", WEBSHOP_RAY_PORT="1", AGENTRL_RAY_PORT="2"
    )
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "AGENTRL_RAY_PORT=2",
        "AGENTRL_TRAIN_ENVS=textcraft",
        "WEBSHOP_CATALOG=/c",
    ]
    assert result.stderr.count("deprecated setting names") == 1
    assert "WEBSHOP_TRAIN_ENVS->AGENTRL_TRAIN_ENVS" in result.stderr


def test_the_slurm_plan_by_hand_reads_the_old_names() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "slurm" / "job-envs.py"), "plan", "--nodes", "2"],
        capture_output=True, text=True, timeout=120,
        env=_clean_env(WEBSHOP_HOME=str(REPO), WEBSHOP_TRAIN_ENVS="textcraft"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "textcraft" in result.stdout and "WEBSHOP_TRAIN_ENVS -> AGENTRL_TRAIN_ENVS" in result.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_json(url: str, server: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + 90
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            response = requests.get(url, timeout=5)
            if response.status_code == 200:
                return response.json()
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def test_the_make_and_slurm_copies_of_webshops_own_settings_are_the_python_ones() -> None:
    """Make and bash cannot import the list, so they carry a copy: the same names, or an old .env's WebShop
    setting would be renamed away where it must stay (or a renamed one kept)."""
    make = (REPO / "mk" / "old-names.mk").read_text()
    make_list = re.search(r"^WEBSHOP_OWN := (.*?)\n(?!\s)", make, re.M | re.S).group(1)
    sbatch_list = re.search(r'^webshop_own="(.*?)"', SBATCH.read_text(), re.M | re.S).group(1)
    for copy in (make_list, sbatch_list):
        assert set(copy.replace("\\", " ").split()) == WEBSHOP_OWN
