"""``agent_envs.ray_serve.attach``: the attach timeout's setting and the head check's answers (the commands
against dead heads: ``tests/integration/test_ray_serve_attach.py``, ``tests/multinode/test_ray_head_loss.py``)."""

from __future__ import annotations

import socket

import pytest

from agent_envs import cluster
from agent_envs.ray_serve.attach import DEFAULT_ATTACH_TIMEOUT_S, AttachError, attach_timeout, check_head


def test_the_attach_timeout_is_a_positive_number_of_seconds() -> None:
    assert attach_timeout({}) == DEFAULT_ATTACH_TIMEOUT_S
    assert attach_timeout({"AGENTRL_RAY_ATTACH_TIMEOUT_S": " 7.5 "}) == 7.5
    for bad in ("soon", "0", "-3", "inf", "nan"):
        with pytest.raises(ValueError, match="AGENTRL_RAY_ATTACH_TIMEOUT_S"):
            attach_timeout({"AGENTRL_RAY_ATTACH_TIMEOUT_S": bad})


def test_check_head_names_the_head_and_the_fault() -> None:
    refused = f"127.0.0.1:{cluster.free_ports(1)[0]}"
    with pytest.raises(AttachError, match=r"Ray head at .*refuses connections.*single point of failure"):
        check_head(refused, timeout=5)
    with pytest.raises(AttachError, match="cannot be reached"):
        check_head("nonexistent.invalid:6379", timeout=5)
    with socket.socket() as live:
        live.bind(("0.0.0.0", 0))  # Ray resolves 127.0.0.1 to this machine's address
        live.listen(1)
        port = live.getsockname()[1]
        assert check_head(f"127.0.0.1:{port}", timeout=5).endswith(f":{port}")
