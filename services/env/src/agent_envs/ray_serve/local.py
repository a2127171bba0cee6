"""A one-node Ray cluster on this machine with the env deployed on it: ``make up-ray`` / ``make down-ray``.

    python -m agent_envs.ray_serve.local up --catalog data/catalog     # prints the env's URL, RAY_ADDRESS
    python -m agent_envs.ray_serve.local status
    python -m agent_envs.ray_serve.local down

``up`` runs ``ray start --head --block`` in a session of its own (its own temp dir and port, no dashboard),
then ``agent-envs serve-ray`` against it, and records the head in ``RUN/ray.json`` (``RUN``: ``run/ray`` at
the repository root unless ``--run-dir`` says otherwise). ``down`` deletes the app and stops exactly that
head's processes, in the order ``ray stop`` uses, without touching any other Ray cluster of the machine
(``ray stop`` would stop them all). The same ``LocalRayHead`` runs the Serve side of ``make bench-ray``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import cluster
from . import DEFAULT_PORT, nodes

OBJECT_STORE_BYTES = 100 * 1000 * 1000  # Ray's minimum is about 75 MiB; the env puts nothing in it
RECORD = "ray.json"


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (index 0 is the state), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _ancestors() -> list[int]:
    found, pid = [], os.getppid()
    while pid > 1:
        found.append(pid)
        fields = proc_stat(pid)
        if fields is None:
            break
        pid = int(fields[1])
    return found


def _binary(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


class LocalRayHead:
    """``ray start --head --block`` in a session of its own; ``leader`` is that process's pid (= session id).

    Args:
        temp_dir: Ray's files (short: Ray's unix sockets must fit in 107 bytes).
        port: the GCS port (0: a free one).
        cpus: Ray CPUs of the node.
        env: the head's environment (default: this process's).
        node_ip: the address the node announces (loopback: nothing outside this machine can join).
    """

    def __init__(self, temp_dir: Path, port: int = 0, cpus: int | None = None, env: Mapping[str, str] | None = None,
                 node_ip: str = "127.0.0.1", leader: int | None = None, gpus: int = 0,
                 object_store_bytes: int | None = OBJECT_STORE_BYTES) -> None:  # fmt: skip
        self.temp_dir = Path(temp_dir)
        self.port = port or cluster.free_ports(1)[0]
        self.cpus = cpus or os.cpu_count() or 1
        self.env = dict(env if env is not None else os.environ)
        self.node_ip = node_ip
        self.leader = leader
        self.gpus = gpus  # a GPU count Ray schedules by (a CPU rehearsal declares some; nothing checks them)
        self.object_store_bytes = object_store_bytes  # None: Ray's own default (a training head needs it)
        self.log_path = self.temp_dir.parent / f"{self.temp_dir.name}-ray-start.log"
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.node_ip}:{self.port}"

    def command(self) -> list[str]:
        """``ray start --head ... --block`` for this head."""
        command = [
            _binary("ray"), "start", "--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
            f"--node-ip-address={self.node_ip}", "--include-dashboard=false", "--disable-usage-stats",
            f"--num-cpus={self.cpus}", f"--num-gpus={self.gpus}", "--block",
        ]  # fmt: skip
        if self.object_store_bytes is not None:
            command.insert(-1, f"--object-store-memory={self.object_store_bytes}")
        return command

    def start(self, timeout: float = 180.0, log=lambda message: None) -> None:
        command = self.command()
        log(f"ray: starting a head on {self.address} (temp dir {self.temp_dir}, {self.cpus} CPUs)")
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            # cwd: its temp dir, so that a worker writing to a relative path never writes into the caller's tree
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                cwd=self.temp_dir, start_new_session=True,
            )  # fmt: skip
        self.leader = self.process.pid
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not start:\n{self.tail()}")
            time.sleep(0.2)

    def alive(self) -> bool:
        if self.leader is not None:
            with contextlib.suppress(ChildProcessError):  # our own child (a test's up and down): reap it
                os.waitpid(self.leader, os.WNOHANG)
        fields = None if self.leader is None else proc_stat(self.leader)
        return fields is not None and fields[0] != "Z"

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def session_pids(self) -> list[int]:
        """This head's processes: its session (workers included), and anything naming its temp dir."""
        if self.leader is None:
            return []
        mine = {os.getpid(), *_ancestors()}
        found = []
        for pid in all_pids():
            fields = proc_stat(pid)
            if pid in mine or fields is None or fields[0] == "Z":  # a zombie is gone (its parent reaps it)
                continue
            if int(fields[3]) == self.leader:
                found.append(pid)
                continue
            with contextlib.suppress(OSError):
                if str(self.temp_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(pid)
        return found

    def stop(self, grace: float = 10.0) -> list[int]:
        """Stop the head in the order of ``ray stop``, but only this head's processes: SIGTERM the raylet (it
        stops its workers) and wait, then the others but the GCS, then the GCS, each for up to ``grace``; then
        ``ray start --block`` (it outlives a SIGTERM), and SIGKILL whatever is left. Returns what is left."""
        if self.leader is None:
            return []

        def kind(pid: int) -> str:
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                return "gone"
            if pid == self.leader:
                return "ray start"
            return {"raylet": "raylet", "gcs_server": "gcs"}.get(Path(argv0).name, "other")

        for bucket in ("raylet", "other", "gcs", "ray start"):
            pids = [pid for pid in self.session_pids() if kind(pid) == bucket]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + (1.0 if bucket == "ray start" else grace)
            while any((proc_stat(pid) or ["Z"])[0] != "Z" for pid in pids):  # a zombie is gone
                if self.process is not None:
                    self.process.poll()  # reap ``ray start`` when it goes
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        for pid in self.session_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        deadline = time.monotonic() + 5
        while self.session_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.session_pids()


# ---- make up-ray / down-ray ------------------------------------------------------------------------------
def default_run_dir() -> Path:
    return cluster.REPO / "run" / "ray"


def _temp_dir(run_dir: Path) -> Path:
    """Short and per run directory: /tmp/webshop-ray-<hash> (a repository path can be too long for Ray)."""
    return Path("/tmp") / f"webshop-ray-{hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:10]}"


def _read(run_dir: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((run_dir / RECORD).read_text())
    return None


def head_of(record: Mapping[str, Any]) -> LocalRayHead:
    """The head an ``up`` record describes (to stop it, or find its processes)."""
    return LocalRayHead(Path(record["temp_dir"]), port=record["port"], leader=record["pid"])


def up(run_dir: Path, catalog: Path | None, serve_port: int = DEFAULT_PORT, replicas_per_node: int = 1,
       cpus: int | None = None, extra: Sequence[str] = (), gpus: int = 0,
       object_store_bytes: int | None = OBJECT_STORE_BYTES) -> dict[str, Any]:  # fmt: skip
    """Start (or reuse) the head recorded in ``run_dir`` and deploy the env on it; returns the record. ``catalog``:
    WebShop's, where it is served (None: serve-ray's default)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    record = _read(run_dir)
    if record is None or not head_of(record).alive():
        head = LocalRayHead(_temp_dir(run_dir), cpus=cpus, gpus=gpus, object_store_bytes=object_store_bytes)
        head.start(log=lambda message: print(message, file=sys.stderr))
        record = {"pid": head.leader, "port": head.port, "address": head.address, "temp_dir": str(head.temp_dir),
                  "log": str(head.log_path)}  # fmt: skip
        (run_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    command = [sys.executable, "-m", "agent_envs.cli", "serve-ray", "--address", record["address"],
               *(["--catalog", str(catalog)] if catalog is not None else []), "--port", str(serve_port),
               "--replicas-per-node", str(replicas_per_node), *extra]  # fmt: skip
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"serve-ray failed (exit status {done.returncode}); the head stays up: `make down-ray`"
        )
    record["env"] = json.loads(done.stdout.strip().splitlines()[-1])
    (run_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def down(run_dir: Path) -> list[str]:
    """Delete the app and stop the recorded head; returns what was stopped."""
    record = _read(run_dir)
    if record is None:
        return []
    head = head_of(record)
    if head.alive():
        subprocess.run(
            [sys.executable, "-m", "agent_envs.cli", "serve-ray", "--address", record["address"], "--down"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False,
        )  # fmt: skip
    left = head.stop()
    if left:
        raise RuntimeError(f"processes of the Ray head are still alive: {left}")
    shutil.rmtree(head.temp_dir, ignore_errors=True)
    head.log_path.unlink(missing_ok=True)
    (run_dir / RECORD).unlink(missing_ok=True)
    return [f"ray head {record['address']} (pid {record['pid']})"]


def machine_gpus() -> int:
    """The NVIDIA GPUs this machine has (``nvidia-smi -L``), honouring ``CUDA_VISIBLE_DEVICES``; 0 without."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return 0
    try:
        listed = subprocess.run(
            [binary, "-L"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_envs.ray_serve.local", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--run-dir", type=Path, default=default_run_dir(), help="default: run/ray")
    parser.add_argument("--catalog", type=Path, default=Path(os.environ.get("CATALOG_DIR", "data/catalog")))
    parser.add_argument("--port", type=int, default=nodes.serve_port(),
                        help=f"Serve's proxy port (default: $AGENTRL_RAY_PORT or {DEFAULT_PORT})")  # fmt: skip
    parser.add_argument("--replicas-per-node", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=None, help="Ray CPUs of the node (default: all cores)")
    parser.add_argument("--gpus", default="auto",
                        help="GPUs the head offers verl (default auto: the machine's, from nvidia-smi; 0 without)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "up":
        gpus = machine_gpus() if args.gpus == "auto" else int(args.gpus)
        try:
            # a head meant for training (GPUs) gets Ray's own object store size; an env-only head a small one
            record = up(args.run_dir, args.catalog, args.port, args.replicas_per_node, args.cpus, gpus=gpus,
                        object_store_bytes=None if gpus else OBJECT_STORE_BYTES)  # fmt: skip
        except RuntimeError as error:
            print(f"up-ray: error: {error}", file=sys.stderr)
            return 1
        print(f"env on Ray Serve: {record['env']['local_url']}   Ray: {record['address']} ({gpus} GPU(s); log "
              f"{record['log']})\n"
              f"train against it: AGENTRL_ENV=ray RAY_ADDRESS={record['address']} AGENTRL_RAY_PORT={args.port} "
              "agent-train train --config test   stop: make down-ray")  # fmt: skip
        return 0
    if args.command == "down":
        for line in down(args.run_dir):
            print(f"stopped {line}")
        return 0
    record = _read(args.run_dir)
    alive = record is not None and head_of(record).alive()
    print(json.dumps({"running": alive, **(record or {})}))
    return 0 if alive else 3


if __name__ == "__main__":
    sys.exit(main())
