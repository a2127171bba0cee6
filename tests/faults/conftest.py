"""The fault-tolerance suite: real replicas, Redis and nginx (``agent_envs.cluster``), real signals, real
network namespaces. Each test measures what a training run would see and records it as a figure; the figures
are printed together at the end of the run (``pytest_terminal_summary``).

Needs nginx and redis-server (``make nginx redis``; ``make test`` installs both); the network-namespace test
also needs root and ``ip`` (iproute2), and skips with the reason otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import _faults


@pytest.fixture(scope="session")
def expert_plans(conformance_catalog) -> dict[int, list[str]]:
    """Synthetic goals (of the first 300) whose expert actions reach reward 1.0, with those actions."""
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions, run_actions

    env = WebShopEnv(conformance_catalog)
    plans: dict[int, list[str]] = {}
    for goal in range(300):
        actions = expert_actions(env, goal, "synthetic")
        if actions and len(actions) >= 3 and run_actions(env, goal, actions, "synthetic")[-1].reward == 1.0:
            plans[goal] = actions
    assert len(plans) >= 64, f"only {len(plans)} goals reach reward 1.0 with the expert"
    return plans


def pytest_terminal_summary(terminalreporter) -> None:
    lines = list(_faults.FIGURES)
    if _faults.FUZZ["cases"]:
        lines.append(
            f"schemathesis, all {len(_checks())} checks: {_faults.FUZZ['cases']} cases, "
            f"{_faults.FUZZ['failures']} failures"
        )
    if lines:
        terminalreporter.section("fault tolerance: figures")
        for line in lines:
            terminalreporter.write_line(line)


def _checks() -> list:
    from schemathesis.checks import CHECKS, load_all_checks

    load_all_checks()
    return list(CHECKS.get_all())
