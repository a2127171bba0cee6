"""Slow and oversized requests are cut off by the replicas as well as by nginx, every error a client can reach
is the documented JSON ``{"error", "detail"}``, and the local cluster supervises process groups, not pids."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import requests
from _faults import figure, start

from agent_envs import cluster

SILENT_CONNECTIONS = 200
AGENTGYM_PATHS = ("/step", "/webshop/reset", "/textcraft/step", "/babyai/reset", "/sciworld/step")


@pytest.fixture(scope="module")
def small_cluster(conformance_catalog_dir, tmp_path_factory):
    record = start(
        conformance_catalog_dir, tmp_path_factory.mktemp("limits"), replicas=1, workers=2,
        env={"AGENTRL_HEADER_TIMEOUT_S": "1", "AGENTRL_ENVS": "webshop,textcraft,babyai"},
    )  # fmt: skip
    try:
        yield record
    finally:
        cluster.down(record["run_dir"], quiet=True)


def raw_exchange(url: str, payload: bytes, wait: float = 15.0) -> tuple[int, dict]:
    """Send raw bytes, read until the server closes; (status, JSON body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        if payload:
            sock.sendall(payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_replica_cuts_off_silent_and_oversized_requests_with_json(small_cluster) -> None:
    replica = small_cluster["replicas"][0]["url"]
    sockets = []
    host, port = replica.removeprefix("http://").split(":")
    for _ in range(SILENT_CONNECTIONS):
        sock = socket.create_connection((host, int(port)), timeout=15)
        sockets.append(sock)
    closed = 0
    for sock in sockets:  # each is answered 408 and closed by the replica after its header timeout
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        closed += data.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in data
        sock.close()
    status, body = raw_exchange(
        replica, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    )
    assert (status, body["error"]) == (431, "header_too_large")
    status, body = raw_exchange(replica, b"NOT HTTP AT ALL\r\n\r\n")
    assert (status, body["error"]) == (400, "bad_request")
    status, body = raw_exchange(replica, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: still typing")
    assert (status, body["error"]) == (408, "request_timeout")
    figure(
        f"replica limits: {closed}/{SILENT_CONNECTIONS} silent connections answered 408 JSON and closed after the "
        "1 s header timeout; 40 KB header -> 431 JSON; garbage -> 400 JSON"
    )
    assert closed == SILENT_CONNECTIONS
    assert requests.get(replica + "/healthz", timeout=10).status_code == 200


def test_balancer_errors_are_json(small_cluster) -> None:
    url = small_cluster["url"]
    seen = {}
    status, body = raw_exchange(
        url, b"GET /v1/info HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    )
    seen["header too large"] = (status, body["error"])
    status, body = raw_exchange(url, b"NOT HTTP AT ALL\r\n\r\n")
    seen["garbage"] = (status, body["error"])
    # the AgentGym routes (their locations set no error_page of their own, which would make these HTML)
    for path in ("/v1/step", *AGENTGYM_PATHS):
        big = requests.post(url + path, data=b"x" * (2 * 1024 * 1024), timeout=30)
        seen[f"body over 1 MiB {path}"] = (big.status_code, big.json()["error"])
    # every replica gone: the balancer's own 502 is JSON too, on every route
    replica = small_cluster["replicas"][0]
    os.killpg(replica["pgid"], signal.SIGKILL)
    time.sleep(0.5)
    native = requests.post(url + "/v1/reset", json={"goal": 1}, timeout=30)
    seen["no replica (native)"] = (native.status_code, native.json()["error"])
    for path in AGENTGYM_PATHS:
        compat = requests.post(url + path, json={"env_idx": 1, "id": 1, "action": "x"}, timeout=30)
        seen[f"no replica {path}"] = (compat.status_code, compat.json()["error"])
    assert seen == {
        "header too large": (431, "header_too_large"),
        "garbage": (400, "bad_request"),
        **{f"body over 1 MiB {path}": (413, "body_too_large") for path in ("/v1/step", *AGENTGYM_PATHS)},
        "no replica (native)": (502, "upstream_unavailable"),
        **{f"no replica {path}": (502, "upstream_unavailable") for path in AGENTGYM_PATHS},
    }
    figure(f"balancer errors, all JSON {{error, detail}}: {seen}")
    # the access log names the client's request and why nginx answered it itself, not only its internal URI
    log = Path(small_cluster["nginx"]["access_log"]).read_text().splitlines()
    lines = [json.loads(line) for line in log]
    failed = [e for e in lines if e["request"] == "POST /textcraft/step HTTP/1.1" and e["status"] == 502]
    assert failed and failed[-1]["error"] == "bad_gateway" and failed[-1]["uri"] == "/_env_error/bad_gateway"
    assert failed[-1]["upstream_status"], failed[-1]


def test_status_and_down_follow_process_groups(conformance_catalog_dir, tmp_path) -> None:
    """Killing a 2-worker replica's recorded pid leaves its workers serving: status says so, down stops them."""
    record = start(conformance_catalog_dir, tmp_path / "cluster", replicas=1, workers=2)
    replica = record["replicas"][0]
    try:
        os.kill(replica["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (state := cluster.status(record["run_dir"]))["replicas"][0]["alive"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        entry = state["replicas"][0]
        assert entry["ready"] is False and entry["orphans"], entry  # its workers live on, unsupervised
        assert "orphaned workers still running" in cluster.describe(state)
    finally:
        cluster.down(record["run_dir"], quiet=True)
    assert not cluster._group_members(replica["pgid"])  # down stopped the whole group
