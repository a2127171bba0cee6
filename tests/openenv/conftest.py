"""Fixtures of the OpenEnv and TRL suites: the environment that holds OpenEnv's client and TRL (``.venv-trl``, made
by ``make venv-trl``), a driver of OpenEnv's real client in it (``_openenv.OpenEnvDriver``), and the fleet: the local
cluster (replicas, Redis, nginx) serving every environment, started from this suite's own environment (``.venv``).

The fleet's tests are ``slow`` (``make test-all``, which makes ``.venv-trl`` first); the protocol-drift test is fast
(``make test`` where ``.venv-trl`` exists). Without ``.venv-trl`` they skip with the command that makes it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # _openenv

from _openenv import FLEET_ENVS, OpenEnvDriver, start_fleet, trl_python

from agent_envs import cluster


@pytest.fixture(scope="session")
def openenv_python() -> Path:
    path = trl_python()
    if path is None:
        pytest.skip("OpenEnv's client and TRL live in .venv-trl: `make venv-trl` (make test-all makes it)")
    return path


@pytest.fixture(scope="module")
def driver(openenv_python: Path) -> Iterator[OpenEnvDriver]:
    with OpenEnvDriver(openenv_python) as running:
        yield running


@pytest.fixture(scope="module")
def fleet(generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Every environment behind one balancer (2 replicas x 2 workers, SciWorld in 2 replicas of its own)."""
    run_dir = tmp_path_factory.mktemp("openenv-fleet")
    record = start_fleet(generated_catalog_dir, run_dir, FLEET_ENVS)
    try:
        yield record
    finally:
        cluster.down(run_dir, quiet=True)
