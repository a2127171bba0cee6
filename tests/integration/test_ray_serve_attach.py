"""Commands that attach to a Ray cluster fail with a clear message when its head is gone, instead of hanging
(issue 29: after a SIGKILL of the head, a new ``ray.init`` hung for more than 150 s).

Two heads that are gone: a port where nothing listens any more (a killed head on a live machine), and a port
that accepts TCP connections but never speaks Ray (a hung head, or a connection that goes nowhere). Both
``agent-envs serve-ray`` and ``agent-train env-check`` return non-zero with the message naming the head
(``AGENTRL_RAY_ATTACH_TIMEOUT_S`` = 10 s); the test's own bound is generous, and nothing is timed beyond "it
returns". Without the attach timeout each command waits on ``ray.init`` past that bound.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agent_envs import cluster

pytestmark = pytest.mark.timeout(900)
BOUND_S = 180  # each command's own bound in this test: far above the 10 s attach timeout


@pytest.fixture
def dead_heads() -> Iterator[dict[str, str]]:
    refused = cluster.free_ports(1)[0]  # nothing listens there
    mute = socket.socket()
    mute.bind(("0.0.0.0", 0))  # Ray resolves 127.0.0.1 to this machine's address
    mute.listen(64)  # the kernel accepts connections; nothing ever answers them
    try:
        yield {"refused": f"127.0.0.1:{refused}", "mute": f"127.0.0.1:{mute.getsockname()[1]}"}
    finally:
        mute.close()


def _run(command: list[str], address: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTRL_RAY_ATTACH_TIMEOUT_S": "10", "RAY_ADDRESS": address}
    env.pop("RAY_AUTH_MODE", None)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=BOUND_S)


@pytest.mark.parametrize("kind", ["refused", "mute"])
def test_serve_ray_and_env_check_fail_clearly_when_the_head_is_gone(dead_heads, kind: str) -> None:
    address = dead_heads[kind]
    port = address.rsplit(":", 1)[1]
    served = _run([sys.executable, "-m", "agent_envs.cli", "serve-ray", "--address", address, "--catalog", "x"],
                  address)  # fmt: skip
    assert served.returncode != 0
    assert "Ray head at" in served.stderr and port in served.stderr, served.stderr[-3000:]
    checked = _run([sys.executable, "-m", "agent_trainer.cli", "env-check", "--episodes", "1"], address)
    assert checked.returncode != 0
    report = json.loads(checked.stdout.strip().splitlines()[-1])
    assert report["ok"] is False and "Ray head at" in report["error"] and port in report["error"]
    assert (
        "env-check: error: the Ray head at" in checked.stderr
    )  # said to the person too, not only in the JSON
