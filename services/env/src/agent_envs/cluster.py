"""The deployment topology on one machine, without Docker: N environment replicas behind a real nginx.

    python -m agent_envs.cluster up --replicas 2 --catalog data/catalog    # ports 36101.. and 36003
    python -m agent_envs.cluster status
    python -m agent_envs.cluster down

``up`` starts a Redis server (the AgentGym sessions shared by every replica and worker; ``redis-server`` from
Debian, loopback only, a memory cap, every write in an append-only file, in ``RUN/redis/``: a restart of the
store loses no acknowledged step; the file is fsynced every second, or before every answer with
``SESSIONS_APPENDFSYNC=always``, the one setting under which a crash loses none either), N ``agent-envs serve`` processes (``python -m agent_envs.cli serve``, ports
``base-port``, ``base-port + 1``, ...) and nginx (Debian's binary, ``nginx -p RUN/nginx -c RUN/nginx.conf``,
rendered from ``configs/nginx/balancer.conf.template``), each in a session of its own with its output in
``RUN/logs/``. It records their pids in ``RUN/pids.json``, waits until every replica's ``/readyz`` and
nginx's ``/nginx-health`` answer, prints the URLs and log files, and returns; the processes stay up.
``down`` stops exactly the recorded process groups (SIGTERM to each group, SIGKILL after a grace period; a
group whose leader died is still stopped, so no orphaned uvicorn worker keeps serving) and removes the pid
file. ``status`` reports each replica's real state: its leader process, orphaned workers of a dead leader, and
whether ``/readyz`` answers within a second (a hung replica shows as not answering). ``RUN`` is ``run/local`` at the repository root unless ``--run-dir`` says
otherwise. Port 0 picks free ports (tests use that).

All replicas share one state secret: ``AGENTRL_STATE_SECRET`` from the environment, else a random one kept
in ``RUN/state_secret`` (mode 600) for this cluster. Other ``AGENTRL_*`` variables pass through.

Importable from tests: ``up(...) -> dict``, ``down(run_dir)``, ``status(run_dir)``, and
``stop_sessions(run_dir, sig)`` / ``start_sessions(run_dir)`` to take the session store down and bring it back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import deploy
from .api.settings import Settings
from .envs import registry


def _repo_root() -> Path:
    """The checkout this package runs from (editable install), else the working directory."""
    checkout = Path(__file__).resolve().parents[4]
    return checkout if (checkout / "configs" / "nginx").is_dir() else Path.cwd()


REPO = _repo_root()
TEMPLATE = REPO / "configs" / "nginx" / "balancer.conf.template"
DEFAULT_RUN_DIR = REPO / "run" / "local"
PIDS = "pids.json"
NGINX_MISSING = "nginx not found: run `make nginx` (apt-get install nginx)"
REDIS_MISSING = "redis-server not found: run `make redis` (apt-get install redis-server)"
REDIS_MAXMEMORY = (
    "512mb"  # as compose's: the session caps (AGENTRL_COMPAT_MAX_SESSIONS) of every environment fit
)
# Durability of the AgentGym sessions (docs/reliability.md): an append-only file, no RDB snapshots; a restart of
# the store (SIGTERM) writes and fsyncs everything first. SESSIONS_APPENDFSYNC: "everysec" (the default; a step
# does not wait for the disk, but a crash can lose answered steps: the last second when the machine goes, and
# when only the store's process is killed, the writes Redis postponed while its last fsync was still running,
# which it answers all the same: scripts/probe_store_crash_loss.py) or "always" (written and fsynced before each
# answer: nothing answered is lost; every step waits for an fsync).
APPENDFSYNC_CHOICES = ("everysec", "always", "no")


def redis_persistence(env: Mapping[str, str]) -> tuple[str, ...]:
    """redis-server's persistence options, with ``SESSIONS_APPENDFSYNC`` from ``env`` (default everysec)."""
    fsync = env.get("SESSIONS_APPENDFSYNC", "").strip() or "everysec"
    if fsync not in APPENDFSYNC_CHOICES:
        raise ClusterError(f"SESSIONS_APPENDFSYNC={fsync!r}: use one of {', '.join(APPENDFSYNC_CHOICES)}")
    return ("--save", "", "--appendonly", "yes", "--appendfsync", fsync)


TEMPLATE_VARS = re.compile(r"\$\{(AGENTRL_[A-Z0-9_]+)\}")


class ClusterError(RuntimeError):
    """The cluster could not be started or stopped; the message says why (with log tails)."""


# ---- helpers --------------------------------------------------------------------------------------------
#: The lowest port :func:`free_ports` hands out: above Ray's worker ports (10002-19999 by default), Redis, Slurm.
PORT_POOL_START = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_pool() -> range | None:
    """The ports :func:`free_ports` picks from: from :data:`PORT_POOL_START` up to the kernel's ephemeral range
    (Linux: 32768-60999), or None where that leaves fewer than 1,000 (or the range cannot be read).

    Why below the ephemeral range: a port picked by binding port 0 is one the kernel hands out again to the next
    ``bind(0)`` or outgoing connection of any process. Between our release and the replica's bind, another process
    took one (a SciWorld JVM's py4j gateway, in the same test run), and the cluster's readiness probe then read
    that process's answer. The kernel never hands out a port below its ephemeral range by itself."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    pool = range(PORT_POOL_START, low)
    return pool if len(pool) >= 1000 else None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free right now (bound and released together), picked at random from
    :func:`port_pool` (ports no other process is given by the kernel meanwhile), else from the kernel's."""
    import random

    sockets: list[socket.socket] = []
    pool = port_pool()
    candidates = random.sample(pool, len(pool)) if pool is not None else []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:  # taken, or in TIME_WAIT
                sock.close()
                continue
            sockets.append(sock)
        while len(sockets) < count:  # no pool, or it is full: the kernel's choice
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def last_resort_servers(servers: str) -> str:
    """The native upstream's replicas again, as ``backup`` servers that are never marked failed.

    With ``max_fails=1`` a replica that times out once under load is out for ``fail_timeout``; when the other
    replicas are out too (one crashed, another slow for a moment), nginx has no live server and answers 502 at
    once, for a stateless step another try would have completed. nginx tries its backups only when every primary
    server has failed, so these cost nothing in normal operation and give such a request each replica once more
    within ``proxy_next_upstream_timeout``."""
    lines = [line for line in servers.splitlines() if line.strip().startswith("server ")]
    return "\n".join(
        re.sub(r"\s*(?:max_fails|fail_timeout)=[^\s;]+", "", line).replace(";", " max_fails=0 backup;")
        for line in lines
    )


def without_backups(upstreams: str) -> str:
    """An upstream body without its ``backup`` servers (hash balancing, the sticky upstreams', refuses them)."""
    return "\n".join(line for line in upstreams.splitlines() if not line.rstrip().endswith(" backup;"))


def affinity_upstreams(upstreams: str) -> str:
    """The sticky upstream's body: the same servers in a shared-memory zone of its own."""
    return without_backups(upstreams).replace("zone env_upstreams", "zone affinity_upstreams")


def session_upstreams(upstreams: str) -> str:
    """The AgentGym routes' upstream body (by session id): the same servers in a zone of their own."""
    return without_backups(upstreams).replace("zone env_upstreams", "zone session_upstreams")


def replica_groups(envs: Sequence[str], replicas: int, workers: int) -> list[dict[str, Any]]:
    """The replicas to start, as groups (``deploy.replica_groups``: from the environments' placements): their
    names, environments, workers and upstream (``any``: every route; ``sticky``: the sticky upstream)."""
    return [{"names": list(g.names), "envs": ",".join(g.envs), "workers": g.workers, "upstream": g.upstream}
            for g in deploy.replica_groups(envs, replicas, workers)]  # fmt: skip


def environment_routes() -> dict[str, str]:
    """The balancer's maps and locations of every registered environment (plugins included), for the template."""
    registrations = list(registry.registrations().values())
    return {"AGENTRL_ENV_MAPS": deploy.nginx_maps(registrations),
            "AGENTRL_ENV_LOCATIONS": deploy.nginx_locations(registrations)}  # fmt: skip


def render_nginx_conf(values: Mapping[str, str], template: Path = TEMPLATE) -> str:
    """Substitute ``${AGENTRL_*}`` placeholders; every one must have a value (nginx's own ``$vars`` stay).
    ``AGENTRL_SESSION_UPSTREAMS`` and ``AGENTRL_AFFINITY_UPSTREAMS`` default to ``AGENTRL_UPSTREAMS``, each in a
    zone of its own; the environments' maps and locations to every registered environment's."""
    text = template.read_text()
    if "AGENTRL_UPSTREAMS" in values:
        upstreams = values["AGENTRL_UPSTREAMS"]
        values = {"AGENTRL_SESSION_UPSTREAMS": session_upstreams(upstreams),
                  "AGENTRL_AFFINITY_UPSTREAMS": affinity_upstreams(upstreams), **values}  # fmt: skip
    if "AGENTRL_ENV_LOCATIONS" not in values:
        values = {**environment_routes(), **values}
    missing = sorted({name for name in TEMPLATE_VARS.findall(text) if name not in values})
    if missing:
        raise ClusterError(f"no value for {', '.join(missing)} in {template}")
    return TEMPLATE_VARS.sub(lambda match: values[match.group(1)], text)


def python_binary() -> str:
    """The interpreter running this module: it has ``agent_envs`` (the replicas import it)."""
    return sys.executable


def nginx_binary() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise ClusterError(NGINX_MISSING)
    return found


def redis_binary() -> str:
    found = shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise ClusterError(REDIS_MISSING)
    return found


def redis_ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Redis server answers PING on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def http_status(url: str, timeout: float = 1.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, urllib.error.URLError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own exited child, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _tail(path: Path, lines: int = 20) -> str:
    try:
        content = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"    ({path}: no log)"
    return "\n".join(f"    {line}" for line in content) or f"    ({path}: empty)"


def _read_pids(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / PIDS).read_text())
    except (OSError, ValueError):
        return None


def _processes(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        *([record["redis"]] if record.get("redis") else []),
        *record.get("replicas", []),
        *([record["nginx"]] if record.get("nginx") else []),
    ]


def _group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (from /proc), zombies excluded."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _secret(run_dir: Path, env: Mapping[str, str]) -> str:
    if env.get("AGENTRL_STATE_SECRET"):
        return env["AGENTRL_STATE_SECRET"]
    path = run_dir / "state_secret"
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(value)
    return value


# ---- commands -------------------------------------------------------------------------------------------
def up(
    replicas: int = 2,
    catalog: Path | str = "data/catalog",
    base_port: int = 36101,
    port: int = 36003,
    workers: int = 1,
    run_dir: Path | str = DEFAULT_RUN_DIR,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    quiet: bool = False,
    redis_port: int = 0,
    serve_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Start the cluster and wait until it answers; returns the record written to ``RUN/pids.json``.

    ``base_port=0`` / ``port=0`` / ``redis_port=0`` pick free ports. A ``AGENTRL_REDIS_URL`` in ``env`` (or in
    this process's environment) names an existing Redis for the AgentGym sessions instead of starting one. ``env`` adds or overrides environment variables of the
    replicas (e.g. ``{"AGENTRL_COMPAT_MAX_SESSIONS": "50"}``); ``serve_args`` extends their ``serve`` command. On failure everything started is stopped and
    ``ClusterError`` carries the tails of the logs.
    """
    if replicas < 1:
        raise ClusterError("--replicas must be at least 1")
    nginx = nginx_binary()
    child_env = {**os.environ, **(env or {})}
    external_redis = child_env.get("AGENTRL_REDIS_URL")
    redis_server = None if external_redis else redis_binary()
    run_dir = Path(run_dir).resolve()
    catalog = Path(catalog).resolve()
    envs = deploy.parse_envs(child_env.get("AGENTRL_ENVS"))
    # The environments' placements make the replica groups: a sticky environment keeps each episode in one
    # process, and the balancer's affinity is per replica, so its replicas run one worker each and, beside other
    # environments, are replicas of their own (as in compose); the others keep their workers and least_conn over
    # every replica. Every served environment must be registered here (the balancer routes what is registered).
    try:
        groups = replica_groups(envs, replicas, workers)
        deploy.routed_check(envs, registry.ids())
        problems = deploy.start_problems(Settings.model_construct(envs=",".join(envs), catalog=catalog))
    except (registry.UnknownEnv, deploy.DeployError) as error:
        raise ClusterError(str(error)) from None
    if problems:
        raise ClusterError("; ".join(problems))
    existing = _read_pids(run_dir)
    if existing and any(_alive(p["pid"]) for p in _processes(existing)):
        raise ClusterError(f"a cluster is already running from {run_dir} (see `status`); run `down` first")
    logs = run_dir / "logs"
    nginx_dir = run_dir / "nginx"
    logs.mkdir(parents=True, exist_ok=True)
    nginx_dir.mkdir(parents=True, exist_ok=True)

    count = sum(len(group["names"]) for group in groups)
    if base_port == 0 or port == 0:
        picked = free_ports(count + 1, host)
        ports = picked[:count] if base_port == 0 else [base_port + i for i in range(count)]
        port = picked[-1] if port == 0 else port
    else:
        ports = [base_port + i for i in range(count)]

    child_env["AGENTRL_STATE_SECRET"] = _secret(run_dir, child_env)
    child_env["WEBSHOP_CATALOG"] = str(catalog)
    child_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each replica sets up its own when it has workers
    record: dict[str, Any] = {
        "run_dir": str(run_dir),
        "catalog": str(catalog),
        "url": f"http://{host}:{port}",
        "port": port,
        "started_unix": int(time.time()),
        "replicas": [],
        "nginx": None,
        "redis": None,
    }
    try:
        if redis_server is not None:
            if not redis_port:  # distinct from the ports picked above, which are free but not held
                redis_port = next(p for p in free_ports(len(ports) + 2, host) if p not in (*ports, port))
            redis_dir = run_dir / "redis"
            redis_dir.mkdir(exist_ok=True)
            redis_log = logs / "redis.log"
            command = [
                redis_server, "--bind", host, "--port", str(redis_port), *redis_persistence(child_env),
                "--maxmemory", REDIS_MAXMEMORY, "--maxmemory-policy", "noeviction", "--dir", str(redis_dir),
                "--daemonize", "no",
            ]  # fmt: skip
            record["redis"] = {"name": "redis", "host": host, "port": redis_port, "command": command,
                               "url": f"redis://{host}:{redis_port}/0", "log": str(redis_log)}  # fmt: skip
            _spawn_redis(record["redis"])
            child_env["AGENTRL_REDIS_URL"] = record["redis"]["url"]
            _write_pids(run_dir, record)
        record["sessions"] = child_env["AGENTRL_REDIS_URL"]
        free = iter(ports)
        for group in groups:
            for name in group["names"]:
                replica_port = next(free)
                log_path = logs / f"{name}.log"
                command = [
                    python_binary(), "-m", "agent_envs.cli", "serve", "--catalog", str(catalog),
                    "--host", host, "--port", str(replica_port), "--workers", str(group["workers"]), *serve_args,
                ]  # fmt: skip
                process = _spawn(command, log_path, {**child_env, "AGENTRL_ENVS": group["envs"]})
                record["replicas"].append(
                    {"name": name, "pid": process.pid, "pgid": process.pid, "port": replica_port,
                     "url": f"http://{host}:{replica_port}", "log": str(log_path), "envs": group["envs"],
                     "upstream": group["upstream"]}
                )  # fmt: skip
                _write_pids(run_dir, record)

        def servers(upstream: str) -> str:
            return "\n".join(
                f"        server {host}:{r['port']} max_fails=1 fail_timeout=10s;"
                for r in record["replicas"] if r["upstream"] == upstream
            )  # fmt: skip

        upstreams = "        zone env_upstreams 256k;\n" + servers("any")
        upstreams += "\n" + last_resort_servers(servers("any"))
        sticky = servers("sticky")
        conf = nginx_dir / "nginx.conf"
        conf.write_text(
            render_nginx_conf(
                {
                    "AGENTRL_UPSTREAMS": upstreams,
                    "AGENTRL_SESSION_UPSTREAMS": session_upstreams(upstreams),
                    "AGENTRL_AFFINITY_UPSTREAMS": (
                        f"        zone affinity_upstreams 256k;\n{sticky}"
                        if sticky
                        else affinity_upstreams(upstreams)
                    ),
                    "AGENTRL_LISTEN_PORT": f"{host}:{port}",
                    "AGENTRL_NGINX_RUNTIME_DIR": str(nginx_dir),
                    "AGENTRL_NGINX_ACCESS_LOG": str(logs / "nginx-access.log"),
                    "AGENTRL_NGINX_ERROR_LOG": str(logs / "nginx-error.log"),
                }
            )
        )
        check = subprocess.run([nginx, "-t", "-q", "-p", str(nginx_dir), "-c", str(conf)],
                               capture_output=True, text=True)  # fmt: skip
        if check.returncode != 0:
            raise ClusterError(f"nginx -t rejected {conf}:\n{check.stderr}")
        nginx_log = logs / "nginx.log"
        process = _spawn([nginx, "-p", str(nginx_dir), "-c", str(conf)], nginx_log, child_env)
        record["nginx"] = {"name": "nginx", "pid": process.pid, "pgid": process.pid, "port": port, "url": record["url"],
                           "log": str(logs / "nginx-error.log"), "access_log": str(logs / "nginx-access.log"),
                           "conf": str(conf)}  # fmt: skip
        _write_pids(run_dir, record)
        _wait_ready(record, timeout)
    except BaseException as error:
        down(run_dir, quiet=True)
        if isinstance(error, ClusterError):
            raise
        if isinstance(error, Exception):
            raise ClusterError(f"starting the cluster failed: {error}") from error
        raise
    if not quiet:
        print(describe(record))
    return record


def _spawn(command: Sequence[str], log_path: Path, env: Mapping[str, str]) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(env),
            cwd=str(REPO), start_new_session=True,  # own process group: `down` stops it and its workers
        )  # fmt: skip


def _spawn_redis(redis: dict[str, Any]) -> None:
    """Start the recorded redis-server command (same port, same data directory); records its pid."""
    process = _spawn(redis["command"], Path(redis["log"]), {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    redis.update(pid=process.pid, pgid=process.pid)


def _recorded_store(run_dir: Path | str) -> tuple[Path, dict[str, Any]]:
    """(run dir, the cluster's record) of a cluster that started its own session store."""
    run_dir = Path(run_dir).resolve()
    record = _read_pids(run_dir)
    if not record or not record.get("redis"):
        raise ClusterError(f"no session store recorded in {run_dir / PIDS} (an external AGENTRL_REDIS_URL?)")
    return run_dir, record


def stop_sessions(
    run_dir: Path | str = DEFAULT_RUN_DIR, sig: signal.Signals = signal.SIGTERM, timeout: float = 10.0
) -> None:
    """Stop the cluster's session store with ``sig`` (SIGTERM: a clean shutdown; SIGKILL: a crash) and wait
    until it is gone: what a restart or a crash of the store does to the replicas, for tests and drills."""
    run_dir, record = _recorded_store(run_dir)
    redis = record["redis"]
    if _ours(redis):
        _signal_group(redis["pid"], sig)
    deadline = time.monotonic() + timeout
    while _alive(redis["pid"]):
        _reap(redis["pid"])
        if time.monotonic() > deadline:
            raise ClusterError(
                f"redis-server (pid {redis['pid']}) still runs {timeout:.0f} s after {sig.name}"
            )
        time.sleep(0.02)


def start_sessions(run_dir: Path | str = DEFAULT_RUN_DIR, timeout: float = 30.0) -> dict[str, Any]:
    """Start the cluster's session store again, as ``up`` started it (its data directory is kept), and wait
    until it answers PING (it has loaded its append-only file by then); returns its record."""
    run_dir, record = _recorded_store(run_dir)
    redis = record["redis"]
    if _alive(redis["pid"]):
        raise ClusterError(f"the session store (pid {redis['pid']}) is running: stop_sessions first")
    _spawn_redis(redis)
    _write_pids(run_dir, record)
    deadline = time.monotonic() + timeout
    while not redis_ping(redis["host"], redis["port"]):
        if not _alive(redis["pid"]) or time.monotonic() > deadline:
            raise ClusterError(f"the session store did not come back; its log {redis['log']}:\n"
                               f"{_tail(Path(redis['log']))}")  # fmt: skip
        time.sleep(0.05)
    return redis


def _write_pids(run_dir: Path, record: Mapping[str, Any]) -> None:
    path = run_dir / PIDS
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(path)


def _wait_ready(record: Mapping[str, Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    checks = [(r, r["url"] + "/readyz") for r in record["replicas"]]
    checks.append((record["nginx"], record["url"] + "/nginx-health"))
    if record.get("redis"):
        checks.append((record["redis"], record["redis"]["url"]))
    pending = list(checks)
    while pending:
        for process, url in list(pending):
            if not _alive(process["pid"]):
                raise ClusterError(
                    f"{process['name']} (pid {process['pid']}) exited during start-up; its log "
                    f"{process['log']}:\n{_tail(Path(process['log']))}"
                )
            if url.startswith("redis://"):
                ready = redis_ping(process["host"], process["port"])
            else:
                ready = http_status(url) == 200
            if ready:
                pending.remove((process, url))
        if not pending:
            return
        if time.monotonic() > deadline:
            waiting = ", ".join(p["name"] for p, _ in pending)
            tails = "\n".join(f"  {p['name']} ({p['log']}):\n{_tail(Path(p['log']))}" for p, _ in pending)
            raise ClusterError(f"not ready after {timeout:.0f} s: {waiting}\n{tails}")
        time.sleep(0.2)


def down(run_dir: Path | str = DEFAULT_RUN_DIR, grace: float = 10.0, quiet: bool = False) -> list[str]:
    """Stop the recorded processes (SIGTERM, then SIGKILL after ``grace`` s); returns what was stopped."""
    run_dir = Path(run_dir).resolve()
    record = _read_pids(run_dir)
    if record is None:
        if not quiet:
            print(f"nothing recorded in {run_dir / PIDS}: nothing to stop")
        return []
    processes = _processes(record)
    targets = [p for p in processes if _ours(p)]
    # A leader that is gone may leave workers in its process group; the group id cannot be reused while any
    # member lives, so signalling the group is safe.
    orphans = [p["pid"] for p in processes if not _alive(p["pid"])]
    for process in targets:
        _signal_group(process["pid"], signal.SIGTERM)
    _signal_orphan_groups(orphans, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_alive(p["pid"]) for p in targets) and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in targets:
        if _alive(process["pid"]):
            _signal_group(process["pid"], signal.SIGKILL)
    _signal_orphan_groups(orphans, signal.SIGKILL)
    for process in targets:
        _reap(process["pid"])
    groups = [p.get("pgid", p["pid"]) for p in processes]
    deadline = time.monotonic() + 5.0  # SIGKILL is asynchronous: return once the groups are really gone
    while any(_group_members(group) for group in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    (run_dir / PIDS).unlink(missing_ok=True)
    stopped = [f"{p['name']} (pid {p['pid']})" for p in targets]
    if not quiet:
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return stopped


def _ours(process: Mapping[str, Any]) -> bool:
    """Still the process we started (guards against a recycled pid)?"""
    pid = process["pid"]
    if not _alive(pid):
        return False
    cmdline = _cmdline(pid)
    expected = {"nginx": "nginx", "redis": "redis-server"}.get(process["name"], "agent_envs")
    return expected in cmdline


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group the process leads (it was started in a session of its own), else the pid."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_orphan_groups(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def status(run_dir: Path | str = DEFAULT_RUN_DIR) -> dict[str, Any] | None:
    """The recorded cluster with ``alive`` and ``ready`` per process, or None when nothing is recorded."""
    record = _read_pids(Path(run_dir).resolve())
    if record is None:
        return None
    for process in record["replicas"]:
        process["alive"] = _alive(process["pid"])
        members = _group_members(process.get("pgid", process["pid"]))
        process["orphans"] = [] if process["alive"] else members
        # ready only if its own leader runs AND it answers within a second (a hung replica does not)
        process["ready"] = process["alive"] and http_status(process["url"] + "/readyz", timeout=1.0) == 200
    if record.get("redis"):
        record["redis"]["alive"] = _alive(record["redis"]["pid"])
        record["redis"]["ready"] = redis_ping(record["redis"]["host"], record["redis"]["port"])
    if record.get("nginx"):
        record["nginx"]["alive"] = _alive(record["nginx"]["pid"])
        record["nginx"]["ready"] = http_status(record["url"] + "/nginx-health") == 200
    return record


def describe(record: Mapping[str, Any]) -> str:
    nginx = record.get("nginx") or {}
    lines = [f"Local cluster ({record['run_dir']}), catalog {record['catalog']}",
             f"  balancer  {record['url']}   (nginx pid {nginx.get('pid', 'not started')})"]  # fmt: skip
    for process in record["replicas"]:
        state = ""
        if "alive" in process:
            state = (
                "  ready"
                if process.get("ready")
                else ("  alive, NOT ANSWERING /readyz" if process["alive"] else "  DOWN")
            )
            if process.get("orphans"):
                state += f" (its leader died; orphaned workers still running: {process['orphans']})"
        served = f"  [{process['envs']}]" if process.get("envs") else ""
        lines.append(f"  {process['name']:<10}{process['url']}{served}   (pid {process['pid']}){state}")
    redis = record.get("redis")
    if redis:
        state = "" if "alive" not in redis else ("  ready" if redis.get("ready") else "  DOWN")
        lines.append(f"  sessions  {redis['url']}   (redis-server pid {redis['pid']}){state}")
    lines.append(
        f"  logs      {Path(record['run_dir']) / 'logs'}/  (replica-N.log, <sticky env>-N.log, nginx-access.log, nginx-error.log)"
    )
    served = [e for process in record["replicas"] for e in str(process.get("envs") or "").split(",") if e]
    lines.append(
        f"  try       curl -s {record['url']}{f'/{served[0]}/v1/info' if served else '/nginx-health'}"
    )
    return "\n".join(lines)


# ---- CLI ------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("up", help="start N replicas and nginx, wait until ready")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--catalog", type=Path, default=Path(os.environ.get("WEBSHOP_CATALOG", "data/catalog")))
    p.add_argument("--base-port", type=int, default=36101, help="first replica port (0: free ports)")
    p.add_argument("--port", type=int, default=36003, help="nginx port (0: a free port)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers per replica")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    for name in ("down", "status"):
        q = commands.add_parser(name)
        q.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            record = up(args.replicas, args.catalog, args.base_port, args.port, args.workers, args.run_dir,
                        args.host, timeout=args.timeout, quiet=args.json)  # fmt: skip
            if args.json:
                print(json.dumps(record, indent=2))
        elif args.command == "down":
            down(args.run_dir)
        else:
            record = status(args.run_dir)
            if record is None:
                print(f"no cluster recorded in {Path(args.run_dir).resolve() / PIDS}")
                return 1
            print(describe(record))
    except ClusterError as error:
        print(f"local_cluster: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
