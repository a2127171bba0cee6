"""Ray Serve against nginx: the env service's throughput and CPU per step on one machine, both paths in one run.

    .venv/bin/python scripts/bench_ray_vs_nginx.py                      # defaults: 2 replicas, 512 episodes
    .venv/bin/python scripts/bench_ray_vs_nginx.py --replicas 2 --episodes 512 --concurrency 64 --rounds 2 --json
    make bench-ray

It starts both paths side by side and keeps them up for the whole run:

- nginx: ``agent_envs.cluster.up`` (what ``python -m agent_envs.cluster up`` runs): REPLICAS uvicorn replicas
  (one worker each) behind a real nginx, Redis for the AgentGym sessions, in a temporary run directory;
- Ray Serve: a private one-node Ray cluster (``ray start --head``: its own temp dir and ports, no dashboard,
  token auth off, ``--num-cpus`` = the machine's cores) and ``agent-envs serve-ray`` with REPLICAS replicas
  per node, Serve's proxy on a free loopback port.

Then, round after round, it runs ``bench-http``'s load (the same function, ``agent_envs.cli.serve.bench_http``:
EPISODES expert episodes, CONCURRENCY in flight, the native protocol) against each path's URL: nginx then
Serve in rounds 1, 3, ..., Serve then nginx in rounds 2, 4, ..., so that drifting machine noise falls on both
alike.

CPU per step is measured over each load's timed window only (the expert plans fetched before it are not):
- machine: the busy time of the whole machine from /proc/stat (user + nice + system + irq + softirq), divided
  by the steps. It includes the load client (this process, the same on both paths) and anything else running
  on the machine (other jobs, another Ray cluster): compare the two paths, not the absolute figure;
- server: the CPU of that path's own processes only (nginx: the cluster's process groups, Redis included;
  Serve: every process of the Ray head's session: GCS, raylet, agents, Serve's controller, proxy, replicas);
- client: this process's CPU (the asyncio load client).

Prints progress on stderr and a markdown table on stdout (``--json``: one JSON object instead). Both paths are
always torn down at the end, on an error or on Ctrl-C too; the temporary directories are removed unless the run
failed (their logs then stay, and the path is printed). Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent_envs import cluster
from agent_envs.cli.serve import bench_http
from agent_envs.client.native import WebShopClient
from agent_envs.ray_serve.local import LocalRayHead, all_pids, proc_stat

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"bench-ray: {message}", file=sys.stderr, flush=True)


def _binary(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found next to {sys.executable} nor on PATH: run `make setup`")
    return found


# ---- CPU accounting ----------------------------------------------------------------------------------------
def machine_busy_s() -> float:
    """Seconds of busy CPU since boot, all cores: user + nice + system + irq + softirq of /proc/stat."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(value) for value in fields[1:8])
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


def processes_cpu_s(selector: Callable[[int, list[str]], bool]) -> dict[int, float]:
    """pid -> CPU seconds (user + system) of the live processes that ``selector(pid, stat_fields)`` picks."""
    result = {}
    for pid in all_pids():
        fields = proc_stat(pid)
        if fields is not None and selector(pid, fields):
            result[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return result


def in_groups(pgids: set[int]) -> Callable[[int, list[str]], bool]:
    return lambda pid, fields: int(fields[2]) in pgids  # pgrp


def in_session(sid: int) -> Callable[[int, list[str]], bool]:
    return lambda pid, fields: int(fields[3]) == sid  # session


def _cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two snapshots (a process started in between counts from zero)."""
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


class CpuWindow:
    """Machine, server and client CPU between ``start()`` and ``stop()``."""

    def __init__(self, server: Callable[[int, list[str]], bool]) -> None:
        self.server = server
        self.started = False

    def start(self) -> None:
        self.wall = time.perf_counter()
        self.machine = machine_busy_s()
        self.client = time.process_time()
        self.processes = processes_cpu_s(self.server)
        self.started = True

    def stop(self) -> dict[str, Any]:
        processes = processes_cpu_s(self.server)
        client = time.process_time() - self.client
        machine = machine_busy_s() - self.machine
        wall = time.perf_counter() - self.wall
        by_process: dict[str, float] = {}
        for pid, value in processes.items():
            label = process_label(pid)
            by_process[label] = by_process.get(label, 0.0) + value - self.processes.get(pid, 0.0)
        return {"wall_s": wall, "machine_s": machine, "server_s": _cpu_delta(self.processes, processes),
                "client_s": client, "server_processes": len(processes), "by_process": by_process}  # fmt: skip


def process_label(pid: int) -> str:
    """A short name for a process: Ray's title (``ray::ProxyActor``), else the program or Python script."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "(gone)"
    argv = [arg for arg in argv if arg] or ["?"]
    if argv[0].startswith("ray::"):  # an actor's title names its current method too: drop it
        return argv[0].strip().split(".", 1)[0]
    if argv[0].startswith("nginx:"):
        return argv[0].strip()
    name = Path(argv[0]).name
    if name.startswith("python"):
        rest = [arg for arg in argv[1:] if not arg.startswith("-")]
        if "-m" in argv:
            return argv[argv.index("-m") + 1]
        return Path(rest[0]).name if rest else name
    return name


@contextlib.contextmanager
def window_from_first_reset(window: CpuWindow) -> Iterator[None]:
    """Start ``window`` at bench_http's first reset, the first request of its timed part (after its plans)."""
    original = WebShopClient.reset

    def reset(self: WebShopClient, *args: Any, **kwargs: Any) -> Any:
        if not window.started:
            window.start()
        return original(self, *args, **kwargs)

    WebShopClient.reset = reset  # type: ignore[method-assign]
    try:
        yield
    finally:
        WebShopClient.reset = original  # type: ignore[method-assign]


RESULT_KEYS = ("steps", "resets", "seconds", "steps_per_s", "p50_ms", "p99_ms", "errors", "mean_reward",
               "distinct_goals")  # fmt: skip


def measure(url: str, server: Callable[[int, list[str]], bool], args: argparse.Namespace) -> dict[str, Any]:
    """One bench_http run against ``url`` with the CPU of its timed window."""
    window = CpuWindow(server)
    with window_from_first_reset(window):
        result = asyncio.run(bench_http(url, concurrency=args.concurrency, episodes=args.episodes))
    cpu = window.stop()
    steps = max(result["steps"], 1)
    return {
        **{key: result[key] for key in RESULT_KEYS},
        "machine_cpu_ms_per_step": round(cpu["machine_s"] * 1000 / steps, 3),
        "server_cpu_ms_per_step": round(cpu["server_s"] * 1000 / steps, 3),
        "client_cpu_ms_per_step": round(cpu["client_s"] * 1000 / steps, 3),
        "machine_cores_busy": round(cpu["machine_s"] / cpu["wall_s"], 2),
        "cpu_window_s": round(cpu["wall_s"], 3),
        "server_processes": cpu["server_processes"],
        "server_cpu_ms_per_step_by_process": {
            label: round(value * 1000 / steps, 3)
            for label, value in sorted(cpu["by_process"].items(), key=lambda item: -item[1])
        },
    }


# ---- the nginx path ----------------------------------------------------------------------------------------
def start_nginx(catalog: Path, replicas: int, run_dir: Path) -> dict[str, Any]:
    log(f"nginx: starting {replicas} replica(s), nginx and Redis in {run_dir}")
    started = time.monotonic()
    record = cluster.up(replicas, catalog, base_port=0, port=0, run_dir=run_dir, quiet=True)
    log(f"nginx: ready at {record['url']} after {time.monotonic() - started:.1f} s")
    return record


def nginx_groups(record: dict[str, Any]) -> set[int]:
    members = [*record["replicas"], record["nginx"], record.get("redis")]
    return {int(member.get("pgid", member["pid"])) for member in members if member}


# ---- the Ray Serve path ------------------------------------------------------------------------------------
def ray_env() -> dict[str, str]:
    """Head, driver and workers: token auth off on both sides (whatever ~/.ray holds), no usage stats."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"})
    return env


def deploy_serve(head: LocalRayHead, catalog: Path, replicas: int, timeout: float = 600.0) -> str:
    """``agent-envs serve-ray`` on the head; returns the local URL once every node serves."""
    port = cluster.free_ports(1)[0]
    command = [
        _binary("agent-envs"), "serve-ray", "--address", head.address, "--catalog", str(catalog),
        "--replicas-per-node", str(replicas), "--port", str(port), "--host", "127.0.0.1",
        "--wait", str(timeout),
    ]  # fmt: skip
    log(f"serve: deploying {replicas} replica(s) with Serve's proxy on 127.0.0.1:{port}")
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=sys.stderr, stdin=subprocess.DEVNULL, env=ray_env(),
        cwd=str(REPO), text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = process.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"serve-ray did not finish within {timeout + 60:.0f} s") from error
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"serve-ray failed (exit status {process.returncode}); see its messages above")
    report = json.loads(lines[-1])
    log(f"serve: ready at {report['local_url']} after {time.monotonic() - started:.1f} s")
    return str(report["local_url"])


# ---- figures -----------------------------------------------------------------------------------------------
def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path's rounds together: steps/s and CPU over all steps; p50/p99 the mean of the rounds' values."""
    steps = sum(run["steps"] for run in runs)
    seconds = sum(run["seconds"] for run in runs)
    result: dict[str, Any] = {
        "steps": steps,
        "steps_per_s": round(steps / seconds, 1) if seconds else 0.0,
        "p50_ms": round(statistics.mean(run["p50_ms"] for run in runs), 2),
        "p99_ms": round(statistics.mean(run["p99_ms"] for run in runs), 2),
        "errors": sum(run["errors"] for run in runs),
    }
    for key in ("machine_cpu_ms_per_step", "server_cpu_ms_per_step", "client_cpu_ms_per_step"):
        result[key] = round(sum(run[key] * run["steps"] for run in runs) / steps, 3) if steps else 0.0
    by_process: dict[str, float] = {}
    for run in runs:
        for label, value in run["server_cpu_ms_per_step_by_process"].items():
            by_process[label] = by_process.get(label, 0.0) + value * run["steps"] / steps
    result["server_cpu_ms_per_step_by_process"] = {
        label: round(value, 3) for label, value in sorted(by_process.items(), key=lambda item: -item[1])
    }
    return result


def ratio(serve: float, nginx: float) -> float | None:
    return round(serve / nginx, 2) if nginx else None


COLUMNS = (
    ("steps_per_s", "steps/s"),
    ("p50_ms", "p50 (ms)"),
    ("p99_ms", "p99 (ms)"),
    ("errors", "errors"),
    ("machine_cpu_ms_per_step", "machine CPU/step (ms)"),
    ("server_cpu_ms_per_step", "server CPU/step (ms)"),
    ("client_cpu_ms_per_step", "client CPU/step (ms)"),
)


def markdown(report: dict[str, Any]) -> str:
    header = "| path | round | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [header, "|" + " --- |" * (len(COLUMNS) + 2)]
    for run in report["runs"]:
        lines.append(
            f"| {run['path']} | {run['round']} | " + " | ".join(str(run[k]) for k, _ in COLUMNS) + " |"
        )
    for path in ("nginx", "serve"):
        figures = report["summary"][path]
        lines.append(f"| **{path}** | all | " + " | ".join(f"**{figures[k]}**" for k, _ in COLUMNS) + " |")
    ratios = report["ratio_serve_over_nginx"]
    cells = [str(ratios.get(key, "")) if ratios.get(key) is not None else "" for key, _ in COLUMNS]
    lines.append(
        "| **Serve / nginx** | | " + " | ".join(f"**{cell}**" if cell else "" for cell in cells) + " |"
    )
    setup = report["setup"]
    lines.append("")
    for path in ("nginx", "serve"):
        shares = report["summary"][path]["server_cpu_ms_per_step_by_process"]
        top = ", ".join(f"{label} {value}" for label, value in list(shares.items())[:8] if value >= 0.005)
        lines.append(f"{path} server CPU per step by process (ms): {top}.  ")
    lines += [
        "",
        f"{setup['replicas']} replicas on each path, {setup['episodes']} expert episodes per run, "
        f"{setup['concurrency']} in flight, {setup['rounds']} round(s); {setup['cpus']} cores; "
        f"idle machine with both paths up: {report['idle']['machine_cores_busy']} cores busy "
        f"(nginx path's processes {report['idle']['nginx_cores']}, Ray's {report['idle']['serve_cores']}); "
        f"load average before/after {setup['load_avg_before']} / {report['load_avg_after']}; "
        f"wall time {report['wall_s']} s.",
    ]
    return "\n".join(lines)


def idle_cpu(seconds: float, selectors: dict[str, Callable[[int, list[str]], bool]]) -> dict[str, float]:
    """Cores busy with nothing sent: the machine, and each path's own processes (their background work)."""
    machine = machine_busy_s()
    before = {name: processes_cpu_s(select) for name, select in selectors.items()}
    started = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - started
    result = {"machine_cores_busy": round((machine_busy_s() - machine) / wall, 3)}
    for name, select in selectors.items():
        result[f"{name}_cores"] = round(_cpu_delta(before[name], processes_cpu_s(select)) / wall, 3)
    return result


# ---- main --------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--catalog", type=Path, default=Path(os.environ.get("CATALOG_DIR") or "data/catalog"),
        help="prepared catalog directory (default: $CATALOG_DIR or data/catalog; `make data` builds it)",
    )  # fmt: skip
    parser.add_argument("--replicas", type=int, default=2, help="replicas on each path (default: 2)")
    parser.add_argument("--episodes", type=int, default=512, help="expert episodes per run (default: 512)")
    parser.add_argument(
        "--concurrency", type=int, default=64, help="episodes in flight at once (default: 64)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2,
        help="rounds; each runs both paths, alternating which goes first (default: 2)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-seconds", type=float, default=5.0,
        help="seconds of idle CPU measured with both paths up, before the rounds (default: 5; 0: skip)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if min(args.replicas, args.episodes, args.concurrency, args.rounds) < 1:
        parser.error("--replicas, --episodes, --concurrency and --rounds must be at least 1")
    if not (args.catalog / "manifest.json").is_file() and not args.catalog.is_absolute():
        args.catalog = REPO / args.catalog  # run from elsewhere than the checkout
    if not (args.catalog / "manifest.json").is_file():
        parser.error(f"{args.catalog} is not a prepared catalog: run `make data`")
    args.catalog = args.catalog.resolve()
    return args


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    began = time.monotonic()
    cpus = os.cpu_count() or 1
    load_before = [round(value, 2) for value in os.getloadavg()]
    # a short temp dir: Ray's socket paths under it must stay within the 107 bytes of a Unix socket name
    head = LocalRayHead(Path(tempfile.mkdtemp(prefix="wsray", dir="/tmp")), cpus=cpus, env=ray_env())
    record: dict[str, Any] | None = None
    failed = False
    try:
        record = start_nginx(args.catalog, args.replicas, workdir / "nginx")
        head.start(log=log)
        serve_url = deploy_serve(head, args.catalog, args.replicas)
        assert head.process is not None
        selectors = {"nginx": in_groups(nginx_groups(record)), "serve": in_session(head.process.pid)}
        urls = {"nginx": record["url"], "serve": serve_url}
        idle = {"machine_cores_busy": None, "nginx_cores": None, "serve_cores": None}
        if args.idle_seconds > 0:
            log(f"idle: {args.idle_seconds:.0f} s with both paths up and nothing sent")
            idle = idle_cpu(args.idle_seconds, selectors)
            log(f"idle: {idle}")
        runs = []
        for round_index in range(1, args.rounds + 1):
            order = ("nginx", "serve") if round_index % 2 else ("serve", "nginx")
            for path in order:
                log(f"round {round_index}/{args.rounds}: {path} ({urls[path]})")
                figures = measure(urls[path], selectors[path], args)
                runs.append({"path": path, "round": round_index, **figures})
                log(
                    f"round {round_index}/{args.rounds}: {path}: "
                    + ", ".join(f"{key} {figures[key]}" for key, _ in COLUMNS)
                )
    except KeyboardInterrupt:
        raise
    except BaseException:
        failed = True
        raise
    finally:
        teardown(record, head, keep_logs=failed)
    summary = {path: pooled([run for run in runs if run["path"] == path]) for path in ("nginx", "serve")}
    return {
        "setup": {
            "replicas": args.replicas,
            "episodes": args.episodes,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "cpus": cpus,
            "catalog": str(args.catalog),
            "load_avg_before": load_before,
            "urls": urls,
        },  # fmt: skip
        "idle": idle,
        "runs": runs,
        "summary": summary,
        "ratio_serve_over_nginx": {
            key: ratio(summary["serve"][key], summary["nginx"][key])
            for key in (
                "steps_per_s",
                "p50_ms",
                "p99_ms",
                "machine_cpu_ms_per_step",
                "server_cpu_ms_per_step",
                "client_cpu_ms_per_step",
            )
        },  # fmt: skip
        "load_avg_after": [round(value, 2) for value in os.getloadavg()],
        "wall_s": round(time.monotonic() - began, 1),
    }


def teardown(record: dict[str, Any] | None, head: LocalRayHead, keep_logs: bool) -> None:
    """Stop both paths (a second Ctrl-C does not interrupt it); Ray's temp dir stays when ``keep_logs``."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            head.stop()
        finally:
            if record is not None:
                log("nginx: stopping the cluster")
                cluster.down(record["run_dir"], quiet=True)
            if keep_logs:
                log(f"ray: logs kept in {head.temp_dir} and {head.log_path}")
            else:
                shutil.rmtree(head.temp_dir, ignore_errors=True)
                head.log_path.unlink(missing_ok=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM (a CI timeout, `kill`) tears down as Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ray-vs-nginx-"))
    failed = True
    try:
        report = run(args, workdir)
        failed = False
    except KeyboardInterrupt:
        failed = False
        log("interrupted; both paths were stopped")
        return 130
    except (RuntimeError, cluster.ClusterError) as error:
        log(f"error: {error}")
        return 1
    finally:
        if failed:
            log(f"logs of the nginx path kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report) if args.json else markdown(report), flush=True)
    return 0 if all(run["errors"] == 0 for run in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
