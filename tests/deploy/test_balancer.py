"""The balancer as compose runs it: configs/nginx/balancer.conf.template rendered by docker/balancer/entrypoint.sh
with the balancer's environment from compose.yaml, then `nginx -t` by an nginx with open-source `resolve`
(>= 1.27.3, like the image's). The upstream is the Docker DNS name `webshop`, which does not resolve here:
with `resolve` nginx looks it up at run time, so the syntax check needs no DNS and is a real check; the
controls below show that a broken template, or the same upstream without `resolve`, fail it."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "configs" / "nginx" / "balancer.conf.template"
ENTRYPOINT = REPO / "docker" / "balancer" / "entrypoint.sh"
ENVIRONMENTS = REPO / "configs" / "nginx" / "environments"  # the image's /etc/agentrl/environments


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    if shutil.which("envsubst") is None:
        pytest.skip("envsubst not found (Debian package gettext-base; the nginx image has it)")


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, 8000)
    except OSError:
        return False
    return True


def _check(
    rendered: dict, nginx: str, runtime: Path, template: Path = TEMPLATE, **overrides: str
) -> subprocess.CompletedProcess[str]:
    """`agentrl-balancer check` with the compose environment of the balancer (runtime dir moved to tmp)."""
    env = {k: str(v) for k, v in rendered["services"]["balancer"]["environment"].items()}
    env.update(
        AGENTRL_NGINX_RUNTIME_DIR=str(runtime), AGENTRL_NGINX_TEMPLATE=str(template), NGINX_BIN=nginx,
        AGENTRL_NGINX_ENVIRONMENTS=str(ENVIRONMENTS),
        PATH="/usr/local/bin:/usr/bin:/bin", **overrides,
    )  # fmt: skip
    return subprocess.run(
        ["sh", str(ENTRYPOINT), "check"], capture_output=True, text=True, env=env, timeout=60
    )


def test_compose_render_passes_nginx_t(rendered: dict, nginx_new: str, tmp_path: Path) -> None:
    result = _check(rendered, nginx_new, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    conf = (tmp_path / "nginx.conf").read_text()
    assert "${AGENTRL_" not in conf
    assert "server envs:8000 max_fails=1 fail_timeout=10s resolve;" in conf
    # three upstream blocks over the same replicas: least_conn for the native routes, by session for the AgentGym
    # routes, sticky by episode for SciWorld; each in a zone of its own (nginx refuses two upstreams in one zone)
    assert conf.count("resolver 127.0.0.11 valid=10s ipv6=off;") == 3
    assert all(f"zone {name}_upstreams " in conf for name in ("env", "session", "affinity"))
    assert "listen 8080 " in conf
    assert "$remote_addr" in conf, "nginx's own variables must survive the rendering"
    # the native routes' last resort (no 502 while every replica is marked failed): the replicas again as backup
    # servers; the hash-balanced upstreams cannot take them (nginx -t above would refuse the file)
    native, session = (
        conf.split(f"upstream {name} {{", 1)[1].split("}", 1)[0]
        for name in ("env_replicas", "session_replicas")
    )
    assert "server envs:8000 max_fails=0 backup resolve;" in native
    assert "backup" not in session


def test_sciworld_upstream_is_its_own_service_when_enabled(
    rendered: dict, nginx_new: str, tmp_path: Path
) -> None:
    """With sciworld (a sticky environment) in AGENTRL_ENVS the sticky upstream holds the sciworld service's
    replicas (its own image, with Java); without it, the same replicas as every other route (which answer 404 for
    it)."""

    def upstream(conf: str, name: str) -> str:
        return conf.split(f"upstream {name} {{", 1)[1].split("}", 1)[0]

    result = _check(rendered, nginx_new, tmp_path / "on", AGENTRL_ENVS="webshop, textcraft,sciworld")
    assert result.returncode == 0, result.stdout + result.stderr
    conf = (tmp_path / "on" / "nginx.conf").read_text()
    assert "server sciworld:8000 max_fails=1 fail_timeout=10s resolve;" in upstream(conf, "affinity_replicas")
    assert "sciworld" not in upstream(conf, "env_replicas")
    assert "hash $episode_affinity" in upstream(conf, "affinity_replicas") and "$http_x_episode" in conf
    result = _check(rendered, nginx_new, tmp_path / "off", AGENTRL_ENVS="webshop,textcraft")
    assert result.returncode == 0, result.stdout + result.stderr
    conf = (tmp_path / "off" / "nginx.conf").read_text()
    assert "server envs:8000 max_fails=1 fail_timeout=10s resolve;" in upstream(conf, "affinity_replicas")


def test_nginx_t_is_a_real_check_a_broken_template_fails(
    rendered: dict, nginx_new: str, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.template"
    broken.write_text(TEMPLATE.read_text().replace("least_conn;", "least_conns;", 1))
    result = _check(rendered, nginx_new, tmp_path / "run", template=broken)
    assert result.returncode != 0
    assert "least_conns" in result.stderr


def test_without_resolve_the_name_would_have_to_resolve(
    rendered: dict, nginx_new: str, tmp_path: Path
) -> None:
    """Control: a plain `server webshop:8000;` makes nginx look the name up while it reads the config."""
    if _resolves("webshop"):
        pytest.skip("`webshop` resolves on this machine")
    result = _check(rendered, nginx_new, tmp_path, AGENTRL_UPSTREAMS="        server webshop:8000;")
    assert result.returncode != 0
    assert "host not found" in result.stderr


def test_a_placeholder_without_value_stops_the_start(rendered: dict, nginx_new: str, tmp_path: Path) -> None:
    template = tmp_path / "new.template"
    template.write_text(
        TEMPLATE.read_text().replace("worker_connections 8192;", "worker_connections ${AGENTRL_X};")
    )
    result = _check(rendered, nginx_new, tmp_path / "run", template=template)
    assert result.returncode == 64
    assert "AGENTRL_X" in result.stderr


def test_balancer_image_defaults_match_compose(rendered: dict) -> None:
    """The image's ENV defaults (for `docker run`) and compose's settings describe the same balancer."""
    dockerfile = (REPO / "docker" / "balancer" / "Dockerfile").read_text()
    for name, value in rendered["services"]["balancer"]["environment"].items():
        assert f"{name}={value}" in dockerfile, f"{name}={value} differs from the Dockerfile's default"


# ---- the rendered balancer at run time, with a stand-in for Docker's embedded DNS ---------------------------------
class _Dns:
    """A loopback DNS server answering A queries for one name (as Docker's 127.0.0.11 does for a service)."""

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, socket.inet_aton(address)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.queries: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet, peer = self.sock.recvfrom(512)
            except OSError:
                continue
            labels, i = [], 12
            while packet[i]:
                labels.append(packet[i + 1 : i + 1 + packet[i]].decode())
                i += 1 + packet[i]
            qtype = struct.unpack(">H", packet[i + 1 : i + 3])[0]
            question = packet[12 : i + 5]
            name = ".".join(labels)
            self.queries.append(name)
            found = name == self.name and qtype == 1
            flags = (
                0x8180 if name == self.name else 0x8183
            )  # response, recursion available; NXDOMAIN otherwise
            header = packet[:2] + struct.pack(">HHHHH", flags, 1, int(found), 0, 0)
            answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 1, 4) + self.address if found else b""
            self.sock.sendto(header + question + answer, peer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


def test_balancer_resolves_the_service_name_at_run_time(nginx_new: str, tmp_path: Path) -> None:
    """entrypoint.sh as the container runs it: `webshop` is looked up through the resolver after nginx started."""

    class Replica(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"replica": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    replica = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    dns = _Dns("webshop", "127.0.0.1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "NGINX_BIN": nginx_new, "AGENTRL_NGINX_TEMPLATE": str(TEMPLATE),
        "AGENTRL_BACKEND": f"webshop:{replica.server_address[1]}", "AGENTRL_RESOLVER": f"127.0.0.1:{dns.port}",
        "AGENTRL_LISTEN_PORT": f"127.0.0.1:{port}", "AGENTRL_NGINX_RUNTIME_DIR": str(tmp_path / "run"),
        "AGENTRL_NGINX_ACCESS_LOG": str(tmp_path / "access.log"), "AGENTRL_NGINX_ERROR_LOG": str(tmp_path / "error.log"),
    }  # fmt: skip
    balancer = subprocess.Popen(["sh", str(ENTRYPOINT)], env=env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        status, body = 0, b""
        for _ in range(100):  # bounded wait for start-up and the first resolution (not a timing assertion)
            if balancer.poll() is not None:
                break
            status, body = _get(f"http://127.0.0.1:{port}/v1/info")
            if status == 200:
                break
            threading.Event().wait(0.1)
        assert balancer.poll() is None, balancer.communicate()[0].decode(errors="replace")
        assert _get(f"http://127.0.0.1:{port}/nginx-health") == (200, b"ok\n")
        assert (status, body) == (200, b'{"replica": "ok"}'), (tmp_path / "error.log").read_text()
        assert "webshop" in dns.queries
    finally:
        if balancer.poll() is None:
            os.killpg(balancer.pid, signal.SIGQUIT)
            try:
                balancer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(balancer.pid, signal.SIGKILL)
                balancer.wait()
        dns.close()
        replica.shutdown()
        replica.server_close()
