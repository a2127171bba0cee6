"""A real Slurm cluster on this one machine, for tests: ``munged``, one ``slurmctld`` and one ``slurmd`` per
test host (a network namespace of ``_netns``, with an address of its own), from Debian's ``slurm-wlm`` and
``munge``::

    with SlurmCluster(nodes=2) as slurm:        # or the fixture: ``slurm_cluster = slurm_fixture()``
        job = slurm.submit(script, extra_args=["--nodes=2"])
        info = slurm.wait(job, timeout=60)       # scontrol's fields once the job is over
        assert info["JobState"] == "COMPLETED", slurm.diagnostics(job)

Everything is private to the cluster: its own munge key and ``munged`` (own socket, pid, log and seed files),
its own slurm.conf (``AuthInfo=socket=...`` points every daemon and client at that munged), ports that were
free, state, spool, pid and log files under one temporary directory. The system's munged, slurm.conf and ports
are never used. ``slurmctld`` runs in this machine's namespace and is reached on the bridge address
(``SlurmctldHost=<this hostname>(<bridge ip>)``: slurmctld only runs where its host name is a SlurmctldHost);
node ``n<i>`` is a ``slurmd -N n<i>`` inside namespace ``i`` (``NodeAddr`` its address, ``NodeHostname=n<i>``,
no /etc/hosts needed). Job steps are that slurmd's children, so they run inside the node's namespace: they see
its address and its loopback, and are cut off with it (``slurm.hosts.cut(i)``).

No accounting (slurmdbd/sacct): job state comes from ``scontrol show job``, and finished jobs stay visible for
``MinJobAge`` (an hour). No cgroups: ``proctrack/linuxproc``, ``task/none`` (slurmd 22.05 still loads a cgroup
plugin at start, so /sys/fs/cgroup must be mounted; it is, outside ``ip netns exec``). Clients: ``slurm.env``
is an environment with ``SLURM_CONF`` set (and no ``SLURM_*`` variables inherited from a surrounding job);
while the cluster is up ``SLURM_CONF`` is also set in ``os.environ``; ``slurm.run(["sinfo"])`` runs a client.

``close()`` (the context manager's exit) cancels jobs, stops the daemons (SIGTERM, then SIGKILL, on their
process groups; what is left of jobs in the nodes' namespaces is killed), copies the logs to ``log_dir`` when
one was given, removes the temporary directory and the namespaces it made. ``diagnostics()`` gives the
daemons' log tails (and the nodes' and a job's state) for failure messages; startup and ``wait`` failures
include them already. What a test process killed outright left behind is removed by the next start
(``sweep_stale_clusters``).

Needs root, ``ip`` and the Debian packages (``make slurm`` installs them); skips the test with the reason
otherwise.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from _netns import Hosts, make_hosts

TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
     "DEADLINE"}
)  # fmt: skip
BINARIES = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "scontrol", "sinfo", "scancel")
_FIELD = re.compile(r"(\S+?)=(.*?)(?=\s+[A-Za-z][\w/:]*=|\s*$)")


DIR_PREFIX = "wsslurm-"  # /tmp/wsslurm-<pid of the test process>-<random>/


def sweep_stale_clusters() -> list[str]:
    """Remove what clusters of test processes that were killed outright left: their daemons (any process whose
    command line names the cluster's directory) and the directory. Returns the directories removed."""
    removed = []
    for path in Path("/tmp").glob(f"{DIR_PREFIX}*-*"):
        owner = path.name[len(DIR_PREFIX) :].split("-")[0]
        if not owner.isdigit() or int(owner) == os.getpid() or Path(f"/proc/{owner}").exists():
            continue
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, ValueError):
                if str(path).encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def parse_fields(line: str) -> dict[str, str]:
    """``scontrol show -o`` output (``Key=value Key=value ...``; values may hold spaces) as a dict."""
    return {key: value for key, value in _FIELD.findall(line.strip())}


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        return f"({error})"
    return text[-chars:] if text.strip() else "(empty)"


class SlurmCluster:
    """``nodes`` Slurm nodes ``n1..n<nodes>``, each a slurmd in a namespace of its own (see the module's
    docstring).

    ``hosts``: namespaces to use (``_netns.Hosts``, at least ``nodes`` of them; the cluster leaves them in
    place on close), else the cluster makes its own. ``cpus``/``real_memory`` (MiB): what each node offers.
    ``log_dir``: where ``close()`` copies the daemons' logs. ``partition``: the one partition, of all nodes.
    """

    def __init__(
        self,
        nodes: int = 2,
        hosts: Hosts | None = None,
        log_dir: Path | str | None = None,
        cpus: int = 1,
        real_memory: int = 512,
        partition: str = "batch",
        start_timeout: float = 60,
        tag: str = "slurm",
    ) -> None:
        self.nodes = nodes
        self.names = [f"n{i}" for i in range(1, nodes + 1)]
        self.hosts = hosts
        self._own_hosts: contextlib.ExitStack | None = None
        self.log_dir = Path(log_dir) if log_dir else None
        self.cpus, self.real_memory, self.partition = cpus, real_memory, partition
        self.start_timeout, self.tag = start_timeout, tag
        self.dir: Path | None = None
        self.conf: Path | None = None
        self.munge_socket: Path | None = None
        self.env: dict[str, str] = {}
        self.jobs: list[str] = []
        self.munged: subprocess.Popen | None = None
        self.slurmctld: subprocess.Popen | None = None
        self.slurmds: list[subprocess.Popen] = []
        self._saved_slurm_conf: str | None = None
        self._exported = False

    # ---- start -------------------------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        missing = ", ".join(b for b in BINARIES if shutil.which(b) is None)
        if missing:
            pytest.skip(f"Slurm/munge not installed ({missing} missing): `make slurm` installs them")
        if os.geteuid() != 0:
            pytest.skip("the Slurm test cluster needs root (network namespaces, slurmd)")
        if self.hosts is None:
            self._own_hosts = contextlib.ExitStack()
            self.hosts = self._own_hosts.enter_context(make_hosts(self.nodes, self.tag))
        if len(self.hosts.namespaces) < self.nodes:
            raise ValueError(f"{self.nodes} nodes need as many hosts, not {len(self.hosts.namespaces)}")
        # a short path: Unix socket paths (munge's, slurmstepd's in the spool) are limited to 108 bytes
        sweep_stale_clusters()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir="/tmp"))
        for sub in ("munge", "state", "spool", "run", "log", "jobs"):
            (self.dir / sub).mkdir(mode=0o700)
        for name in self.names:
            (self.dir / "spool" / name).mkdir(mode=0o700)
        # munged wants its socket's directories searchable by all (it serves every user)
        self.dir.chmod(0o711)
        (self.dir / "munge").chmod(0o711)
        self._start_munged()
        self._write_conf()
        # from a job this test might run in, and the project's settings of the caller (make exports AGENTRL_ENVS to
        # every recipe): a test job's settings are its own (job_env), never the shell's that ran the suite
        inherited = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "AGENTRL_", "WEBSHOP_")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
        self.env["SLURM_CONF"] = str(self.conf)
        self._saved_slurm_conf = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(self.conf)
        self._exported = True
        self.slurmctld = self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._await("slurmctld answering", lambda: self.run(["scontrol", "ping"], timeout=10).returncode == 0)
        for i, name in enumerate(self.names):
            argv = ["slurmd", "-D", "-N", name, "-f", str(self.conf)]
            self.slurmds.append(self._daemon(f"slurmd-{name}", argv, host=i))
        self._await("all nodes idle", self._all_idle)

    def _daemon(self, name: str, argv: list[str], host: int | None = None) -> subprocess.Popen:
        assert self.dir is not None
        with open(self.dir / "log" / f"{name}.out", "wb") as out:  # the child keeps its own copy
            kwargs = {
                "stdout": out,
                "stderr": subprocess.STDOUT,
                "stdin": subprocess.DEVNULL,
                "env": self.env or None,
            }
            if host is None:
                return subprocess.Popen(argv, start_new_session=True, **kwargs)
            assert self.hosts is not None
            return self.hosts.popen(host, argv, start_new_session=True, **kwargs)

    def _start_munged(self) -> None:
        assert self.dir is not None
        munge = self.dir / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = munge / "munge.socket"
        self.munged = self._daemon(
            "munged",
            ["munged", "--foreground", f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={munge / 'munged.pid'}", f"--log-file={self.dir / 'log' / 'munged.log'}",
             f"--seed-file={munge / 'munged.seed'}", "--num-threads=2"],
        )  # fmt: skip

        def answers() -> bool:
            sock = f"--socket={self.munge_socket}"
            cred = subprocess.run(["munge", "--no-input", sock], capture_output=True, timeout=10)
            back = subprocess.run(["unmunge", sock], input=cred.stdout, capture_output=True, timeout=10)
            return cred.returncode == 0 and back.returncode == 0

        self._await("munged answering", answers, check_daemons=[self.munged])

    def _write_conf(self) -> None:
        assert self.dir is not None and self.hosts is not None
        d = self.dir
        controller = socket.gethostname().split(".")[0]
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={name} NodeAddr={ip} CPUs={self.cpus} "
            f"RealMemory={self.real_memory} State=UNKNOWN"
            for name, ip in zip(self.names, self.hosts.ips[: self.nodes], strict=True)
        )
        (d / "plugstack.conf").write_text("")  # no SPANK plugins from /etc/slurm/plugstack.conf.d
        self.conf = d / "slurm.conf"
        self.conf.write_text(
            f"""# written by tests/multinode/_slurm.py
ClusterName=ws{os.getpid()}
SlurmctldHost={controller}({self.hosts.bridge_ip})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
MailProg=/bin/true
SlurmdDebug=info
PlugStackConfig={d}/plugstack.conf
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=3600
{nodes}
PartitionName={self.partition} Nodes={",".join(self.names)} Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _await(self, what: str, ready, check_daemons: Sequence[subprocess.Popen] | None = None) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            daemons = check_daemons if check_daemons is not None else self._daemons()
            dead = [p.args for p in daemons if p.poll() is not None]
            if dead:
                failure = f"a daemon exited before {what}: {dead}"
            elif ready():
                return
            elif time.monotonic() > deadline:
                failure = f"not {what} after {self.start_timeout:.0f} s"
            else:
                time.sleep(0.25)
                continue
            raise RuntimeError(f"Slurm test cluster: {failure}\n{self.diagnostics()}")

    def _daemons(self) -> list[subprocess.Popen]:
        return [p for p in (self.munged, self.slurmctld, *self.slurmds) if p is not None]

    def _all_idle(self) -> bool:
        states = self.node_states()
        return sorted(states) == sorted(self.names) and all(state == "idle" for state in states.values())

    # ---- use ---------------------------------------------------------------------------------------------

    def run(
        self, argv: Sequence[str], timeout: float = 30, env: dict[str, str] | None = None, **kwargs
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (in this machine's namespace) against this cluster; output captured as text.
        ``env`` adds to (or overrides) ``self.env``."""
        return subprocess.run(
            list(argv),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )

    def node_states(self) -> dict[str, str]:
        """``{"n1": "idle", ...}`` per ``sinfo`` (``*`` suffix: not responding)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
        return (
            dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())
            if out.returncode == 0
            else {}
        )

    def submit(
        self, script: Path | str, env: dict[str, str] | None = None, extra_args: Sequence[str] = ()
    ) -> str:
        """``sbatch --parsable`` of ``script`` (run from ``self.dir/jobs``; output there unless ``extra_args``
        say otherwise); ``env`` adds to the cluster's client environment. Returns the job id."""
        assert self.dir is not None
        args = ["sbatch", "--parsable", f"--chdir={self.dir / 'jobs'}", *extra_args, str(script)]
        if not any(a.startswith(("--output", "-o")) for a in extra_args):
            args[2:2] = [f"--output={self.dir / 'jobs'}/slurm-%j.out"]
        result = self.run(args, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed ({result.returncode}): {result.stderr}\n{self.diagnostics()}")
        job = result.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o <id>`` as a dict (empty when Slurm does not know the job (any more))."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=15)
        return parse_fields(out.stdout.splitlines()[0]) if out.returncode == 0 and out.stdout.strip() else {}

    def wait(self, job_id: str, timeout: float = 60, poll: float = 0.5) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job's state is terminal (``TERMINAL``); its fields then.

        Raises ``TimeoutError`` (with the daemons' log tails) when it is not over within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in TERMINAL:
                return info
            time.sleep(poll)
        raise TimeoutError(f"job {job_id} not over after {timeout:.0f} s: {info.get('JobState')}\n"
                           f"{self.diagnostics(job_id)}")  # fmt: skip

    def output(self, job_id: str) -> str:
        """The job's standard output file (``StdOut`` per scontrol)."""
        path = self.job(job_id).get("StdOut")
        return Path(path).read_text(errors="replace") if path and Path(path).exists() else ""

    def logs(self) -> dict[str, Path]:
        """The daemons' log files (Slurm's own log files and each daemon's stdout/stderr)."""
        d = (self.dir or Path("/nonexistent")) / "log"
        return {p.name: p for p in sorted(d.glob("*"))} if d.exists() else {}

    def diagnostics(self, job_id: str | None = None, chars: int = 2500) -> str:
        """For failure messages: the job's fields and output, the nodes' states, every daemon log's tail."""
        parts = []
        with contextlib.suppress(Exception):
            if job_id is not None:
                parts.append(
                    f"--- job {job_id}: {self.job(job_id)}\n--- its output:\n{self.output(job_id)[-chars:]}"
                )
            if self.slurmctld is not None:
                nodes = self.run(["scontrol", "show", "node", "-o"], timeout=10)
                parts.append(f"--- nodes:\n{nodes.stdout.strip() or nodes.stderr.strip()}")
        for name, path in self.logs().items():
            parts.append(f"--- {name} (tail):\n{_tail(path, chars)}")
        return "\n".join(parts)

    def _kill_leftovers(self) -> None:
        """SIGKILL what is left of jobs in the nodes' namespaces: slurmstepd and tasks, told apart from
        anything else there (the hosts may be shared) by ``SLURM_CONF=<this cluster's slurm.conf>`` in their
        environment."""
        if self.hosts is None or self.conf is None:
            return
        mark = f"SLURM_CONF={self.conf}".encode()
        for i in range(self.nodes):
            for pid in self.hosts.pids(i):
                with contextlib.suppress(OSError):
                    if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                        os.kill(pid, signal.SIGKILL)

    # ---- stop --------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel jobs, stop the daemons, keep the logs (``log_dir``), remove state and namespaces.

        Idempotent."""
        if self.slurmctld is not None and self.slurmctld.poll() is None:
            with contextlib.suppress(Exception):
                if self.jobs:
                    self.run(["scancel", *self.jobs], timeout=10)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    active = self.run(["squeue", "-h", "-o", "%i"], timeout=10)
                    if active.returncode != 0 or not active.stdout.strip():
                        break
                    time.sleep(0.25)
        for process in self.slurmds:
            _stop(process)
        with contextlib.suppress(Exception):
            self._kill_leftovers()
        for process in (self.slurmctld, self.munged):
            if process is not None:
                _stop(process)
        self.slurmds, self.slurmctld, self.munged = [], None, None
        if self._exported:
            if self._saved_slurm_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self._saved_slurm_conf
            self._exported = False
        if self.dir is not None:
            if self.log_dir is not None:
                with contextlib.suppress(OSError):
                    self.log_dir.mkdir(parents=True, exist_ok=True)
                    for name, path in self.logs().items():
                        shutil.copyfile(path, self.log_dir / name)
                    for path in (self.dir / "jobs").glob("*.out"):  # the jobs' own output
                        shutil.copyfile(path, self.log_dir / path.name)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self._own_hosts is not None:
            self._own_hosts.close()
            self._own_hosts, self.hosts = None, None


def _stop(process: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM to the process group (each daemon leads its own session), SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)


def slurm_fixture(name: str = "slurm_cluster", scope: str = "function", nodes: int = 2, **kwargs):
    """A pytest fixture named ``name`` that yields a started ``SlurmCluster`` (logs kept under the test's
    temporary directory, log tails printed when the test fails). In a test module: ``slurm_cluster =
    slurm_fixture()``."""

    @pytest.fixture(scope=scope, name=name)
    def _fixture(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[SlurmCluster]:
        log_dir = tmp_path_factory.mktemp(f"{name}-logs")
        with SlurmCluster(nodes=nodes, log_dir=log_dir, **kwargs) as cluster:
            yield cluster
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                print(f"Slurm test cluster (logs kept in {log_dir}):\n{cluster.diagnostics()}")

    return _fixture


REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "agent-grpo.sbatch"
#: The env's Serve port on every node of a test job.
SERVE_PORT = 8000


def job_env(catalog: Path, **extra: str) -> dict[str, str]:
    """The sbatch's environment for a test job: this checkout and venv, the catalog, Ray's files in a short temporary
    directory; the caller's RAY_* and AGENTRL_* settings left out."""
    env = {
        "AGENTRL_HOME": str(REPO),
        "AGENTRL_VENV": str(Path(sys.executable).parent.parent),
        "WEBSHOP_CATALOG": str(catalog),
        "AGENTRL_RAY_PORT": str(SERVE_PORT),
        "RAY_TEMP_DIR": tempfile.mkdtemp(prefix="wsslp-", dir="/tmp"),  # short: Ray's unix sockets
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_memory_monitor_refresh_ms": "0",
        **extra,
    }
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AGENTRL_", "WEBSHOP_"))},
        **env,
    }


def wait_for(predicate, timeout: float, what: str, slurm: SlurmCluster, job: str) -> None:
    """Poll ``predicate`` every second until it holds; a timeout says what was awaited, with the job's output."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s\n{slurm.output(job)[-4000:]}\n"
                               f"{slurm.diagnostics(job)}")  # fmt: skip
        time.sleep(1.0)


class JobEnded(AssertionError):
    """The job ended before what a test waited for (its state and output tail in the message)."""


def submit_until_started(
    slurm: SlurmCluster, script: Path, env: dict[str, str], started, timeout: float, tries: int = 4,
    extra_args: Sequence[str] = (),
) -> tuple[str, list[Path]]:  # fmt: skip
    """Submit ``script`` until a job gets as far as ``started(job, output)`` says, each with a fresh short
    ``RAY_TEMP_DIR`` (Ray's unix sockets); returns the job and the temp dirs used (the last is the job's).

    Why more than once: a raylet gets 30 s to register (Ray's own bound), which the saturated 2-core machine can
    miss; such a job fails before its training (serve-ray would wait for the missing node for 10 minutes, so it
    is cancelled at once) and a new one starts clean. A job that ends otherwise raises ``JobEnded``."""
    from _raynodes import figure

    from agent_trainer.rehearsal.run import RAY_START_TIMEOUT

    missed = (RAY_START_TIMEOUT, "did not attach within")
    temps: list[Path] = []
    for attempt in range(tries):
        temps.append(Path(tempfile.mkdtemp(prefix="wsslv-", dir="/tmp")))
        job = slurm.submit(script, env={**env, "RAY_TEMP_DIR": str(temps[-1])}, extra_args=extra_args)

        def check(job: str = job) -> bool:
            output = slurm.output(job)
            if started(job, output):
                return True
            if any(m in output for m in missed):
                slurm.run(["scancel", job])
            state = slurm.job(job).get("JobState")
            if state in TERMINAL - {"PREEMPTED"}:
                raise JobEnded(f"job {job} ended {state}\n{output[-6000:]}")
            return False

        try:
            wait_for(check, timeout, "the job's start", slurm, job)
            return job, temps
        except JobEnded:
            if attempt == tries - 1 or not any(m in slurm.output(job) for m in missed):
                raise
            figure(
                f"Slurm job {job}: a Ray node missed Ray's start-up bound on the loaded machine; submitted again"
            )
    raise AssertionError("unreachable")
