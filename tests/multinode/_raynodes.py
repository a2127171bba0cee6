"""A real multi-node Ray cluster on one machine: one ``ray start`` per test host (network namespace).

Each node is small (1 CPU, the minimum object store, no dashboard) so three fit the 2-core CI machine, has a
temp dir of its own (socket and session files must not collide on one filesystem), and runs ``ray start
--block`` in a session of its own, so the test can SIGKILL exactly one node's Ray processes.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _netns import Hosts

RAY_PORT = 6379
#: Figures measured by the multi-node tests; conftest prints them at the end of the run.
FIGURES: list[str] = []
OBJECT_STORE_BYTES = 80 * 1024 * 1024
BIN = Path(sys.executable).parent


def ray_env() -> dict[str, str]:
    """The nodes' and drivers' environment: token auth off (explicit on every side, whatever ~/.ray holds),
    no usage stats, no memory monitor killing workers on a busy CI machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_memory_monitor_refresh_ms": "0",
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
    })  # fmt: skip
    return env


@dataclass
class RayNodes:
    hosts: Hosts
    root: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.hosts.ips[0]}:{RAY_PORT}"

    def start(self, cpus: int = 1, timeout: float = 180.0, gpus: int = 0,
              object_store_bytes: int = OBJECT_STORE_BYTES) -> None:  # fmt: skip
        """``gpus``: GPUs each node declares (Ray schedules by them; a CPU training run's FSDP workers)."""
        for i, ip in enumerate(self.hosts.ips):
            role = ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"] if i == 0 else [
                f"--address={self.address}"
            ]  # fmt: skip
            temp = self.root / f"n{i}"
            temp.mkdir(parents=True, exist_ok=True)
            log = (self.root / f"ray-start-{i}.log").open("wb")
            self.processes.append(
                self.hosts.popen(
                    i,
                    [str(BIN / "ray"), "start", *role, f"--node-ip-address={ip}", f"--num-cpus={cpus}",
                     f"--num-gpus={gpus}", f"--object-store-memory={object_store_bytes}", "--disable-usage-stats",
                     f"--temp-dir={temp}", "--block"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ray_env(),
                    start_new_session=True,
                )
            )  # fmt: skip
            if i == 0:
                self.wait_nodes(1, timeout)
        self.wait_nodes(len(self.hosts.ips), timeout)

    def driver(self, i: int, code: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` in host ``i`` with ``ADDRESS`` set to the cluster's address."""
        return self.hosts.run(
            i, [sys.executable, "-c", f"ADDRESS = {self.address!r}\n{code}"], timeout=timeout, env=ray_env()
        )

    def alive_nodes(self) -> int:
        done = self.driver(
            0,
            "import ray\nray.init(address=ADDRESS, logging_level='ERROR', log_to_driver=False)\n"
            "print(sum(1 for n in ray.nodes() if n['Alive']))",
            timeout=60,
        )
        return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0

    def wait_nodes(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_nodes() < count:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"the Ray cluster did not reach {count} node(s):\n{self.logs()}")
            time.sleep(1.0)

    def kill_node(self, i: int) -> None:
        """SIGKILL every Ray process of node ``i`` (its ``ray start`` session: raylet, workers, proxy, replicas)."""
        process = self.processes[i]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        # Ray's own children that left the session (none expected) are still in the node's temp dir's session
        for pid in self.hosts.pids(i):
            with contextlib.suppress(OSError):
                if f"{self.root / f'n{i}'}" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    os.kill(pid, signal.SIGKILL)

    def logs(self, lines: int = 30) -> str:
        out = []
        for path in sorted(self.root.glob("ray-start-*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        for i, process in enumerate(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            self.kill_node(i)


def figure(line: str) -> None:
    """Record a measured figure for the end-of-run summary (and print it for -s runs)."""
    FIGURES.append(line)
    print(line)


#: The rehearsal's trainer-side checks (its weight-sync probe needs the rehearsal's own prepared files).
REHEARSAL_CHECKS = "AGENTRL_REHEARSAL_"


def rehearsal_run_settings(line: str, work: Path, turn_tokens: int, catalog: Path, checks: bool = True
                           ) -> tuple[dict, list, list]:  # fmt: skip
    """What the rehearsal's training run needs on a namespace cluster of several nodes: its environment (the CPU
    seams, the agent-loop configs), its Ray overrides (gloo on each namespace's own interface) and its scale-down
    (the joined-cluster variant, the GPU count per node left to the caller). ``checks=False``: the CPU seams
    without the rehearsal's trainer-side checks (a run on data the rehearsal did not prepare)."""
    from agent_trainer.rehearsal import run as rehearsal

    env, ray = rehearsal._line_env(line, work, rehearsal.DEAD_URL, turn_tokens, catalog)
    if not checks:
        env = {k: v for k, v in env.items() if not k.startswith(REHEARSAL_CHECKS)}
        ray = [o for o in ray if f"env_vars.{REHEARSAL_CHECKS}" not in o]
    env.update(rehearsal.loop_configs(work, rehearsal.MAX_OBSERVATION_CHARS))
    # gloo binds to the address the hostname resolves to, which no namespace has: its own interface instead
    ray.append("+ray_kwargs.ray_init.runtime_env.env_vars.GLOO_SOCKET_IFNAME='eth0'")
    scale = [rehearsal.JOINED_CLUSTER.get(o, o) for o, _ in rehearsal.SCALE]
    scale = [o for o in scale if o is not None and not o.startswith("trainer.n_gpus_per_node=")]
    return env, ray, scale


def _sessions(temp: Path) -> list[Path]:
    """The Ray session folders under one run's temp dir (``session_latest`` is a link to one of them)."""
    return sorted({p.resolve() for p in temp.glob("session_*")})


def fsdp_worker_nodes(temp: Path) -> Counter[str]:
    """Per node address, the processes of verl's FSDP workers (Ray actors of a ``WorkerDict`` class) in one run.
    Both nodes' Ray files share the temp dir here (one /tmp): each worker's core log names its node's address."""
    nodes: Counter[str] = Counter()
    for logs in (s / "logs" for s in _sessions(temp)):
        for out in logs.glob("worker-*.out"):
            if "WorkerDict" not in out.read_text(errors="replace")[:4000]:
                continue
            worker_id = out.name.split("-")[1]
            for core in logs.glob(f"python-core-worker-{worker_id}_*.log"):
                found = re.search(
                    r"Initializing worker at address: ([\d.]+):", core.read_text(errors="replace")
                )
                if found:
                    nodes[found.group(1)] += 1
    return nodes


def env_steps_served(temp: Path, since: datetime.datetime, route: str = "/v1/step") -> Counter[str]:
    """Per node address, the env steps (``route``: WebShop's; ``/textcraft/v1/step``, ...) its own Serve proxy
    (``proxy_<address>.log``) passed on at or after ``since`` (local time, as Ray's logs; env-check's episodes
    come before it)."""
    served: Counter[str] = Counter()
    for logs in (s / "logs" / "serve" for s in _sessions(temp)):
        for proxy in logs.glob("proxy_*.log"):
            address = proxy.stem.removeprefix("proxy_")
            for line in proxy.read_text(errors="replace").splitlines():
                stamp = re.match(r"\w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),", line)
                if route in line and stamp and datetime.datetime.fromisoformat(stamp.group(1)) >= since:
                    served[address] += 1
    return served
