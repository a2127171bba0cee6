"""A Docker engine for the end-to-end test: the one DOCKER_HOST (or the default socket) points at, or a `dockerd`
started here as root with its own data root, socket, exec root and pid file, so that it never touches another
engine's state and can be stopped by its pid.

    python tests/docker/dockerd.py start     start one (if none is running at the socket); prints its DOCKER_HOST
    python tests/docker/dockerd.py stop      stop the one `start` started (by its pid file)

The data root persists between runs (/var/lib/webshop-dockerd), so the stand-in base images and the build cache
are reused by the next run on the same machine; a fresh machine builds them once.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DATA_ROOT = Path(os.environ.get("AGENTRL_DOCKERD_DATA_ROOT", "/var/lib/webshop-dockerd"))
RUN_DIR = Path(os.environ.get("AGENTRL_DOCKERD_RUN_DIR", "/run/webshop-dockerd"))
SOCKET = RUN_DIR / "docker.sock"
PIDFILE = RUN_DIR / "dockerd.pid"
LOGFILE = RUN_DIR / "dockerd.log"
HOST = f"unix://{SOCKET}"


class EngineError(RuntimeError):
    """No Docker engine can be reached or started; the message says what to install or set."""


def docker_cli() -> str:
    return os.environ.get("DOCKER", "docker")


def reachable(host: str | None) -> bool:
    """Does `docker info` answer at this DOCKER_HOST (None: the CLI's default)?"""
    if shutil.which(docker_cli()) is None:
        return False
    env = dict(os.environ)
    if host:
        env["DOCKER_HOST"] = host
    else:
        env.pop("DOCKER_HOST", None)
    try:
        result = subprocess.run([docker_cli(), "info"], capture_output=True, env=env, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


@dataclass
class Engine:
    host: str | None  # DOCKER_HOST for the clients; None: the CLI's default
    started: bool  # this process started it (and must stop it)


_started: subprocess.Popen | None = None  # the dockerd this process started (reaped by stop)


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent (kill(pid, 0) succeeds on those)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pid() -> int | None:
    try:
        pid = int(PIDFILE.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def start(timeout: float = 90.0) -> Engine:
    """Start dockerd with its own data root, socket and pid file (root only); reuse it if it already runs."""
    if reachable(HOST):
        return Engine(HOST, started=False)
    if os.geteuid() != 0:
        raise EngineError("no Docker engine is reachable and starting one needs root (or set DOCKER_HOST)")
    dockerd = shutil.which("dockerd")
    if dockerd is None or shutil.which(docker_cli()) is None:
        raise EngineError(
            "no Docker engine is reachable and dockerd or the docker CLI is missing: apt-get install docker.io debootstrap "
            "(or point DOCKER_HOST at an engine)"
        )
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    global _started
    with LOGFILE.open("ab") as log:
        process = _started = subprocess.Popen(
            [dockerd, "--data-root", str(DATA_ROOT), "--exec-root", str(RUN_DIR / "exec"), "--pidfile", str(PIDFILE),
             "--host", HOST, "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineError(f"dockerd exited with {process.returncode}; its log: {LOGFILE}")
        if reachable(HOST):
            return Engine(HOST, started=True)
        time.sleep(1)
    stop()
    raise EngineError(f"dockerd did not answer within {timeout:.0f} s; its log: {LOGFILE}")


def stop(timeout: float = 60.0) -> None:
    """Stop the dockerd `start` started (SIGTERM by its pid file: it stops its containers first)."""
    pid = _pid()
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _started is not None and _started.pid == pid:
            _started.poll()  # reap it: our own child
        if not _alive(pid):
            return
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)


def find_or_start(allow_start: bool) -> Engine | None:
    """The engine DOCKER_HOST (or the default socket) points at; else ours; else, if allowed, a new one."""
    configured = os.environ.get("DOCKER_HOST")
    if reachable(configured):
        return Engine(configured, started=False)
    if reachable(HOST):
        return Engine(HOST, started=False)
    return start() if allow_start else None


def main(argv: list[str]) -> int:
    if argv[1:] == ["start"]:
        try:
            print(start().host)
        except EngineError as error:
            print(f"engine: {error}", file=sys.stderr)
            return 1
        return 0
    if argv[1:] == ["stop"]:
        stop()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
