"""Integration fixtures: real replica processes and a real nginx on free loopback ports.

- ``cluster``: 2 replicas + nginx (``agent_envs.cluster``), the conformance catalog, for the session;
- ``replica``: one stand-alone replica (1 worker) with a small AgentGym session cap (50), for the session;
- ``expert_plans``: goals whose expert episode reaches reward 1.0, computed in-process on the same catalog.

nginx must be installed (``make nginx``); without it the cluster fixtures fail with that instruction.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _support import COMPAT_CAP, Replica, start_cluster

from agent_envs import cluster as cluster_module


@pytest.fixture(scope="session")
def local_cluster() -> ModuleType:
    return cluster_module


@pytest.fixture(scope="session")
def cluster(local_cluster: ModuleType, conformance_catalog_dir: Path, tmp_path_factory) -> Iterator[dict]:
    """2 replicas + nginx for the whole session; the record of ``local_cluster.up`` (urls, pids, logs)."""
    run_dir = tmp_path_factory.mktemp("cluster")
    record = start_cluster(local_cluster, conformance_catalog_dir, run_dir)
    try:
        yield record
    finally:
        local_cluster.down(run_dir, quiet=True)


@pytest.fixture(scope="session")
def replica(conformance_catalog_dir: Path, tmp_path_factory) -> Iterator[Replica]:
    """A stand-alone replica, 1 worker, AgentGym session cap 50."""
    log = tmp_path_factory.mktemp("replica") / "replica.log"
    server = Replica(conformance_catalog_dir, log, env={"AGENTRL_COMPAT_MAX_SESSIONS": str(COMPAT_CAP)})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def expert_plans(conformance_catalog) -> dict[int, list[str]]:
    """Synthetic goals (of the first 300) whose expert actions reach reward 1.0, with those actions."""
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions, run_actions

    env = WebShopEnv(conformance_catalog)
    plans: dict[int, list[str]] = {}
    for goal in range(300):
        actions = expert_actions(env, goal, "synthetic")
        if actions and run_actions(env, goal, actions, "synthetic")[-1].reward == 1.0:
            plans[goal] = actions
    assert len(plans) >= 64, f"only {len(plans)} goals reach reward 1.0 with the expert"
    return plans
