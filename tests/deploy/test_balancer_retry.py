"""The second pass (`error_page 502 = @native_again` for the native routes, `@<env>_sessions_again` for an
environment's AgentGym and OpenEnv session routes): where nginx itself answers 502 after trying every server, the
request starts once more on the current servers, body and all, under the same request id (the session store applies
an AgentGym request once by that id).

Why it exists: with servers resolved at run time (compose's balancer, nginx >= 1.27.3 `resolve`), a DNS change
while a request is between two tries makes nginx refuse the next try ("no live upstreams": the request's snapshot
of the servers is stale), and `make test-docker` saw a native step answered 502 when a replica was killed. That
race needs Docker's DNS; this test makes nginx answer 502 on the first pass another way, deterministically: the one
replica (listed once as a server and once as a backup) drops its first two connections. CI saw the race on an
AgentGym route too: a step whose replica was killed with the session store answered 502, not the store's 503."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx

from agent_envs import cluster


class DropsFirstConnections:
    """A replica that closes its first `drops` connections unanswered (nginx: "upstream prematurely closed", an
    error it re-sends on), then answers every request with what it received."""

    def __init__(self, drops: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.drops, self.seen = drops, 0
        self.bodies: list[bytes] = []
        self.request_ids: list[str] = []  # of every connection, dropped ones included
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.seen += 1
            if self.seen <= self.drops:
                self.request_ids.append(_request_id(connection.recv(65536)))
                connection.close()
                continue
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            self.request_ids.append(_request_id(head))
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))  # fmt: skip
            while len(body) < length:
                body += connection.recv(65536)
            self.bodies.append(body)
            answer = json.dumps({"echo": json.loads(body)}).encode()
            connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                               + str(len(answer)).encode() + b"\r\nconnection: close\r\n\r\n" + answer)  # fmt: skip


def _request_id(head: bytes) -> str:
    return next((line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                 if line.lower().startswith(b"x-request-id:")), "")  # fmt: skip


def _balancer(tmp_path: Path, port: int, upstreams: str) -> subprocess.Popen:
    conf = tmp_path / "nginx.conf"
    conf.write_text(cluster.render_nginx_conf({
        "AGENTRL_UPSTREAMS": upstreams, "AGENTRL_SESSION_UPSTREAMS": cluster.session_upstreams(upstreams),
        "AGENTRL_AFFINITY_UPSTREAMS": cluster.affinity_upstreams(upstreams), "AGENTRL_LISTEN_PORT": f"127.0.0.1:{port}",
        "AGENTRL_NGINX_RUNTIME_DIR": str(tmp_path), "AGENTRL_NGINX_ACCESS_LOG": str(tmp_path / "access.log"),
        "AGENTRL_NGINX_ERROR_LOG": str(tmp_path / "error.log"),
    }))  # fmt: skip
    nginx = subprocess.Popen([cluster.nginx_binary(), "-p", str(tmp_path), "-c", str(conf)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    for _ in range(200):
        if cluster.http_status(f"http://127.0.0.1:{port}/nginx-health") == 200:
            return nginx
        time.sleep(0.05)
    raise AssertionError("nginx did not start")


def _one_replica_balancer(tmp_path: Path, replica: DropsFirstConnections) -> tuple[int, subprocess.Popen]:
    line = f"        server 127.0.0.1:{replica.port} max_fails=1 fail_timeout=10s;"
    upstreams = "        zone env_upstreams 256k;\n" + line + "\n" + cluster.last_resort_servers(line)
    port = cluster.free_ports(1)[0]
    return port, _balancer(tmp_path, port, upstreams)


def _stop(nginx: subprocess.Popen, replica: DropsFirstConnections) -> None:
    os.killpg(nginx.pid, signal.SIGTERM)
    nginx.wait(10)
    replica.listener.close()


def test_a_native_step_nginx_answered_502_is_sent_once_more_with_its_body(tmp_path: Path) -> None:
    replica = DropsFirstConnections(drops=2)
    port, nginx = _one_replica_balancer(tmp_path, replica)
    try:
        step = {"state": "s" * 1000, "action": "click[buy now]"}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/step", json=step, timeout=20)
    finally:
        _stop(nginx, replica)
    # the first pass: the server and its backup copy both dropped (2 connections); the second: answered
    assert (answer.status_code, answer.json()) == (200, {"echo": step}), answer.text
    assert replica.seen == 3 and len(replica.bodies) == 1


def test_an_agentgym_step_nginx_answered_502_is_sent_once_more_under_the_same_request_id(
    tmp_path: Path,
) -> None:
    """The session upstream (by session hash) has no backup copies: one dropped connection is the first pass's 502.
    The second pass must reach the replica with the body and the first pass's X-Request-Id, or the store would
    apply a step twice whose first try had reached a replica that died before answering."""
    replica = DropsFirstConnections(drops=1)
    port, nginx = _one_replica_balancer(tmp_path, replica)
    try:
        step = {"env_idx": 7, "action": "click[buy now]"}
        answer = httpx.post(f"http://127.0.0.1:{port}/webshop/step", json=step, timeout=20)
        named = {"id": 3, "action": "look"}  # OpenEnv's named sessions change state exactly once the same way
        session = httpx.post(
            f"http://127.0.0.1:{port}/babyai/openenv/sessions/s1/step", json=named, timeout=20
        )
    finally:
        _stop(nginx, replica)
    assert (answer.status_code, answer.json()) == (200, {"echo": step}), answer.text
    assert (session.status_code, session.json()) == (200, {"echo": named}), session.text
    assert replica.seen == 3 and len(replica.bodies) == 2
    first, again, other = replica.request_ids
    assert first and first == again and other != first, replica.request_ids


def test_a_session_route_whose_second_pass_fails_too_answers_the_json_502(tmp_path: Path) -> None:
    replica = DropsFirstConnections(drops=10)
    port, nginx = _one_replica_balancer(tmp_path, replica)
    try:
        answer = httpx.post(
            f"http://127.0.0.1:{port}/textcraft/step", json={"id": 1, "action": "look"}, timeout=20
        )
    finally:
        _stop(nginx, replica)
    assert answer.status_code == 502 and answer.json()["error"] == "upstream_unavailable", answer.text
    assert answer.headers["retry-after"] == "1"
    assert replica.seen == 2 and len(set(replica.request_ids)) == 1  # two passes, no loop
