"""Serve's HTTP proxy has the balancer's request limits (issue 29), seen with raw sockets on a real deployment.

``make up-ray``'s one-node Ray cluster with the env deployed by ``agent-envs serve-ray`` (short timeouts:
``AGENTRL_HEADER_TIMEOUT_S`` / ``AGENTRL_BODY_TIMEOUT_S`` = 2 s). Before, Serve's proxy (plain uvicorn in a Ray
actor) accepted a 1 MiB header, held half-sent request heads and bodies open forever, and answered non-HTTP
bytes in plain text. Now, as through nginx: a request head over 32 KiB gets 431, a head or body that stalls
gets 408, a body over 1 MiB gets 413, garbage gets 400, each the service's JSON ``{"error", "detail"}``, and
the connection is closed; well-formed requests (an episode, a POST body) are served as before.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from agent_envs import cluster
from agent_envs.client import WebShopClient
from agent_envs.ray_serve import local

pytestmark = pytest.mark.timeout(600)
SECRET = "ray-serve-limits-test-secret-0123456789"
SILENT_CONNECTIONS = 100


@pytest.fixture(scope="module")
def serve_url(generated_catalog_dir: Path, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENTRL_STATE_SECRET", SECRET)
        patch.setenv("AGENTRL_HEADER_TIMEOUT_S", "2")
        patch.setenv("AGENTRL_BODY_TIMEOUT_S", "2")
        run_dir = tmp_path_factory.mktemp("ray-limits") / "run"
        port = cluster.free_ports(1)[0]
        try:
            record = local.up(run_dir, generated_catalog_dir, port, replicas_per_node=1, cpus=1)
            yield record["env"]["local_url"]
        finally:
            local.down(run_dir)


def raw_exchange(url: str, payload: bytes, wait: float = 30.0) -> tuple[int, dict, bytes]:
    """Send raw bytes, read until the server closes; (status, JSON body, response head)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        if payload:
            sock.sendall(payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body), head


def test_serve_proxy_cuts_off_oversized_stalled_and_garbage_requests_with_json(serve_url: str) -> None:
    seen = {}
    # half-sent request heads (the probe: 1,000 stayed open 40 s): each is answered 408 and closed
    host, port = serve_url.removeprefix("http://").split(":")
    sockets = [socket.create_connection((host, int(port)), timeout=30) for _ in range(SILENT_CONNECTIONS)]
    for sock in sockets:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    closed = 0
    for sock in sockets:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        closed += data.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in data
        sock.close()
    seen["half-sent heads answered 408 and closed"] = closed

    big = b"GET /v1/info HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    status, body, head = raw_exchange(serve_url, big)
    seen["40 KB header"] = (status, body["error"])
    assert b"application/json" in head.lower()
    status, body, _ = raw_exchange(serve_url, b"NOT HTTP AT ALL\r\n\r\n")
    seen["garbage"] = (status, body["error"])
    status, body, _ = raw_exchange(
        serve_url, b"POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab"
    )
    seen["body: 2 of 100 bytes"] = (status, body["error"])
    status, body, _ = raw_exchange(
        serve_url, b"POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n" + b"x" * 1000
    )
    seen["body: 2 MiB announced"] = (status, body["error"])
    chunked = b"".join(b"%x\r\n%s\r\n" % (65536, b"x" * 65536) for _ in range(20))  # 1.25 MiB, no length
    status, body, _ = raw_exchange(
        serve_url, b"POST /v1/step HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
    )
    seen["body: 1.25 MiB chunked"] = (status, body["error"])
    status, body, _ = raw_exchange(serve_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: still typing")
    seen["head stalls"] = (status, body["error"])
    assert seen == {
        "half-sent heads answered 408 and closed": SILENT_CONNECTIONS,
        "40 KB header": (431, "header_too_large"),
        "garbage": (400, "bad_request"),
        "body: 2 of 100 bytes": (408, "request_timeout"),
        "body: 2 MiB announced": (413, "body_too_large"),
        "body: 1.25 MiB chunked": (413, "body_too_large"),
        "head stalls": (408, "request_timeout"),
    }

    # well-formed requests still pass: a POST body reaches the replica whole, an episode plays
    async def episode() -> dict:
        async with WebShopClient(serve_url) as client:
            first = await client.reset(3, goal_set="synthetic")
            return await client.step(first["state"], "search[red shoes]")

    assert "observation" in asyncio.run(episode())
