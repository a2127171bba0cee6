"""A replica that hangs (SIGSTOP: it holds its port and accepts connections, but never answers) while 64
episodes run concurrently, one of two replicas, frozen for longer than the balancer's fail_timeout (so it is
probed again while still hung): nginx's short upstream timeouts move its requests to the other replica, so no
episode is lost, even with a client that never retries; an episode is delayed by about one upstream read
timeout (2 s) at worst."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import requests
from _faults import CONCURRENT, figure, run_slots, signal_replica, start

from agent_envs import cluster

FREEZE_AFTER_S = 0.4
FROZEN_RUN_S = 14.0  # longer than fail_timeout (10 s): the hung replica is probed again while still hung


def test_sigstop_of_one_replica_loses_no_episode(conformance_catalog_dir, expert_plans, tmp_path) -> None:
    assert len(expert_plans) >= CONCURRENT
    record = start(conformance_catalog_dir, tmp_path / "cluster")
    frozen = [0.0, 0.0]
    try:
        baseline = asyncio.run(run_slots(record["url"], expert_plans, retries=None, seconds=0))
        assert all(r == 1.0 for _, r, _ in baseline), baseline

        async def freeze() -> None:
            await asyncio.sleep(FREEZE_AFTER_S)
            signal_replica(record, 0, signal.SIGSTOP)
            frozen[0] = time.monotonic()

        try:
            # retries=0: the balancer alone must route around the hung replica
            results = asyncio.run(
                run_slots(record["url"], expert_plans, retries=0, seconds=FROZEN_RUN_S, on_started=freeze)
            )
            frozen[1] = time.monotonic()
            state = cluster.status(record["run_dir"])
            assert state is not None and state["replicas"][0]["ready"] is False  # status sees the hang
        finally:
            signal_replica(record, 0, signal.SIGCONT)
    finally:
        cluster.down(record["run_dir"], quiet=True)

    lost = [(g, r) for g, r, _ in results if r != 1.0]
    base = {g: t for g, _, t in baseline}
    times = [t for _, _, t in results]
    delays = [t - base[g] for g, _, t in results]
    figure(
        f"SIGSTOP of 1 of 2 replicas (2 workers each) for {frozen[1] - frozen[0]:.1f} s under {CONCURRENT} "
        f"concurrent episodes ({len(results)} episodes, client without retries): {len(lost)} lost; episode "
        f"time median {statistics.median(times):.2f} s, worst {max(times):.2f} s (unfrozen: median "
        f"{statistics.median(base.values()):.2f} s); worst delay {max(delays):.2f} s; "
        f"{sum(d > 1.0 for d in delays)} episodes delayed > 1 s"
    )
    assert not lost, lost[:3]


def _resets(url: str, goals: Sequence[int]) -> list[int]:
    """The HTTP status of a native reset of each goal, sent at once (no client retry)."""
    with ThreadPoolExecutor(len(goals)) as pool:
        return list(
            pool.map(
                lambda goal: requests.post(f"{url}/v1/reset", json={"goal": goal}, timeout=30).status_code,
                goals,
            )
        )


def test_no_502_when_every_replica_was_marked_failed(conformance_catalog_dir, tmp_path) -> None:
    """The 502 of a stateless step while a replica crashed on a loaded machine (make test-docker, issue 36): one
    replica dead, the other slow for a moment (here frozen 3 s, longer than the 2 s read timeout), so that nginx
    marks both failed (max_fails=1). Without more servers nginx then answers the next steps 502 at once ("no live
    upstreams") although the slow replica answers again; with each replica listed again as a never-failed backup
    server, every step is served: those in flight while it is frozen once it thaws, those after it at once."""
    record = start(conformance_catalog_dir, tmp_path / "cluster", workers=1)
    try:
        signal_replica(record, 1, signal.SIGKILL)  # crashed: connection refused
        signal_replica(record, 0, signal.SIGSTOP)  # slow: accepts, answers late
        threading.Timer(3.0, signal_replica, (record, 0, signal.SIGCONT)).start()
        during = _resets(record["url"], range(8))  # both replicas fail these requests once each
        after = _resets(record["url"], range(8, 16))  # both are marked failed now, one answers
    finally:
        signal_replica(record, 0, signal.SIGCONT)
        cluster.down(record["run_dir"], quiet=True)
    assert during == [200] * 8, during
    assert after == [200] * 8, after


def test_hung_workers_are_replaced_and_a_hung_single_process_replica_exits(
    conformance_catalog_dir, tmp_path
) -> None:
    """Two layers: in a multi-worker replica, uvicorn's supervisor pings its workers and replaces a hung one;
    a replica whose serving process hangs with no supervisor around it (one worker) is ended by its own
    watchdog thread, which sees /healthz go unanswered and exits (status 70) so compose restarts it."""
    record = start(conformance_catalog_dir, tmp_path / "cluster", replicas=1, workers=2)
    replica = record["replicas"][0]
    try:
        workers = [
            pid for pid in cluster._group_members(replica["pgid"]) if "spawn_main" in cluster._cmdline(pid)
        ]
        assert len(workers) == 2, workers
        hung_at = time.monotonic()
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            fresh = [
                p for p in cluster._group_members(replica["pgid"]) if "spawn_main" in cluster._cmdline(p)
            ]
            if set(fresh).isdisjoint(workers) and cluster.http_status(replica["url"] + "/healthz") == 200:
                break
            time.sleep(0.2)
        replaced_after = time.monotonic() - hung_at
        assert set(fresh).isdisjoint(workers), "the hung workers were not replaced"
    finally:
        cluster.down(record["run_dir"], quiet=True)

    # the watchdog, on a server that answers /healthz once and then hangs (accepts, never answers)
    probe = subprocess.run(
        [sys.executable, "-c", WATCHDOG_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert probe.returncode == 70, probe.stdout + probe.stderr
    watchdog_after = float(probe.stdout.split()[-1])
    figure(
        f"hung replica processes: uvicorn replaced 2 hung workers of a replica in {replaced_after:.1f} s; the "
        f"watchdog ended a hung single-process server {watchdog_after:.1f} s after it hung (probe every 0.5 s, "
        "2 misses; exit status 70 for the supervisor)"
    )


WATCHDOG_SCRIPT = """
import os, socket, sys, threading, time
from agent_envs.cli.serve import start_watchdog
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen(64)
port = listener.getsockname()[1]
hung = []
def serve():
    connection, _ = listener.accept()  # the first probe is answered...
    connection.recv(65536)
    connection.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\nok")
    connection.close()
    hung.append(time.monotonic())  # ...then the server hangs: connections queue, nothing answers
threading.Thread(target=serve, daemon=True).start()
os.environ["AGENTRL_WATCHDOG_FAILURES"] = "2"
real_exit = os._exit
def report_exit(code):
    print("hung for", round(time.monotonic() - hung[0], 2))
    sys.stdout.flush()
    real_exit(code)
os._exit = report_exit
start_watchdog("127.0.0.1", port, 0.5)
time.sleep(45)
print("watchdog never fired")
sys.exit(1)
"""
