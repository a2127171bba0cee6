"""The head of a Ray cluster is lost: commands that attach to the cluster say so instead of hanging (issue 29).

A real 2-node Ray cluster (head + worker, each in a network namespace of its own, ``ray start``). The head is
lost in one of two ways: its Ray processes are SIGKILLed (its address then refuses connections), or its link
goes down (its address no longer answers at all: a blackhole). Then, on the worker node, ``agent-envs
serve-ray`` and ``agent-train env-check`` are pointed at the head, as a requeued job step or an operator
would: each returns non-zero with the message naming the head, within the test's generous bound (the probe
that found it: a new ``ray.init`` hung for more than 150 s). Nothing is timed beyond "it returns".

Needs root and ``ip``; skips with the reason otherwise. Everything it creates is removed.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from _netns import make_hosts
from _raynodes import RayNodes, figure, ray_env

pytestmark = pytest.mark.timeout(900)
BOUND_S = 240  # each command's bound here: far above AGENTRL_RAY_ATTACH_TIMEOUT_S


@pytest.fixture
def two_nodes():
    root = Path(tempfile.mkdtemp(prefix="wshead-", dir="/tmp"))  # short: Ray's unix socket paths
    with make_hosts(2, "head") as hosts:
        nodes = RayNodes(hosts, root)
        try:
            nodes.start()
            yield nodes
        finally:
            nodes.stop()
            shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("fault", ["kill", "cut"])
def test_attaching_to_a_lost_head_fails_with_a_message(two_nodes: RayNodes, fault: str) -> None:
    nodes, hosts = two_nodes, two_nodes.hosts
    assert nodes.alive_nodes() == 2
    if fault == "kill":
        nodes.kill_node(0)
    else:
        hosts.cut(0)
    env = {**ray_env(), "RAY_ADDRESS": nodes.address, "AGENTRL_RAY_ATTACH_TIMEOUT_S": "20"}
    served = hosts.run(
        1, [sys.executable, "-m", "agent_envs.cli", "serve-ray", "--address", nodes.address, "--catalog", "x"],
        timeout=BOUND_S, env=env,
    )  # fmt: skip
    assert served.returncode != 0
    assert f"Ray head at {nodes.address}" in served.stderr, served.stderr[-3000:]
    checked = hosts.run(1, [sys.executable, "-m", "agent_trainer.cli", "env-check", "--episodes", "1"],
                        timeout=BOUND_S, env=env)  # fmt: skip
    assert checked.returncode != 0
    report = json.loads(checked.stdout.strip().splitlines()[-1])
    assert report["ok"] is False and f"Ray head at {nodes.address}" in report["error"], report
    figure(f"head {fault}: serve-ray and env-check on the worker said: {report['error'][:120]}...")
