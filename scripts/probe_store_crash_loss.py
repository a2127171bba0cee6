"""Probe: does a SIGKILL of the session store (Redis, with the project's persistence flags) lose writes it had
already answered, while its disk is slow? (docs/reliability.md, "the session store restarts or crashes").

With ``appendfsync everysec`` Redis fsyncs its append-only file in a background thread once a second, and while
that fsync is still running it *postpones writing* new changes to the file (for up to 2 s) but answers the
clients all the same. A SIGKILL in that window loses changes a client was told were done. With ``always`` it
writes and fsyncs before it answers.

The probe makes the disk slow on demand: it builds a tiny ``LD_PRELOAD`` library (with ``cc``) that adds
``--fsync-delay-ms`` to every fsync of that one redis-server, starts it with the flags ``make up-local`` uses
(``agent_envs.cluster.redis_persistence``), has one client increment a counter for ``--seconds`` plus up to
one (each answer is an acknowledged write), SIGKILLs the server, starts it again from the same directory and compares. One line
per run: acknowledged, found after the restart, lost.

    .venv/bin/python scripts/probe_store_crash_loss.py --modes everysec,always --runs 5
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from agent_envs import cluster

SLOW_FSYNC_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
static void slow(void) { const char *ms = getenv("PROBE_FSYNC_DELAY_MS"); if (ms) usleep(atoi(ms) * 1000); }
int fdatasync(int fd) { static int (*real)(int); if (!real) real = dlsym(RTLD_NEXT, "fdatasync"); slow(); return real(fd); }
int fsync(int fd) { static int (*real)(int); if (!real) real = dlsym(RTLD_NEXT, "fsync"); slow(); return real(fd); }
"""


def _start(
    data: Path, port: int, mode: str, preload: Path, delay_ms: int
) -> tuple[subprocess.Popen, redis.Redis]:
    env = {**os.environ, "LD_PRELOAD": str(preload), "PROBE_FSYNC_DELAY_MS": str(delay_ms)}
    flags = cluster.redis_persistence({"SESSIONS_APPENDFSYNC": mode})
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), *flags, "--dir", str(data)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 5.0
    while not cluster.redis_ping("127.0.0.1", port):
        if time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"redis-server did not answer on port {port}")
        time.sleep(0.05)
    return server, redis.Redis(port=port, socket_timeout=5)


def run_once(mode: str, seconds: float, delay_ms: int, preload: Path, workdir: Path) -> tuple[int, int]:
    """(writes acknowledged before the SIGKILL, writes found after the restart)."""
    data = workdir / f"data-{mode}"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    (port,) = cluster.free_ports(1)
    server, client = _start(data, port, mode, preload, delay_ms)
    acknowledged = 0
    # the kill at any phase of the background fsync's second
    ends = time.monotonic() + seconds + random.uniform(0.0, 1.0)
    while time.monotonic() < ends:
        acknowledged = int(client.incr("acknowledged"))
        time.sleep(0.002)
    server.send_signal(signal.SIGKILL)
    server.wait()
    server, client = _start(data, port, mode, preload, 0)
    try:
        found = int(client.get("acknowledged") or 0)
    finally:
        server.terminate()
        server.wait()
    return acknowledged, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--modes", default="everysec,always", help="SESSIONS_APPENDFSYNC values, comma-separated"
    )
    parser.add_argument("--runs", type=int, default=5, help="kills per mode")
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="how long the client writes before the kill (plus 0-1 s)"
    )
    parser.add_argument("--fsync-delay-ms", type=int, default=300, help="added to every fsync: the slow disk")
    args = parser.parse_args()
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    for mode in modes:
        try:
            cluster.redis_persistence({"SESSIONS_APPENDFSYNC": mode})  # the cluster's own check of a mode
        except cluster.ClusterError as error:
            parser.error(f"--modes: {error}")
    for tool in ("cc", "redis-server"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} not found (apt-get install {'gcc' if tool == 'cc' else 'redis-server'})")
    with tempfile.TemporaryDirectory(prefix="store-crash-") as tmp:
        workdir = Path(tmp)
        (workdir / "slow_fsync.c").write_text(SLOW_FSYNC_C)
        preload = workdir / "slow_fsync.so"
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-o", str(preload), str(workdir / "slow_fsync.c"), "-ldl"], check=True
        )
        print(
            f"every fsync {args.fsync_delay_ms} ms slower; {args.runs} SIGKILLs per mode after {args.seconds} s"
        )
        for mode in modes:
            for run in range(1, args.runs + 1):
                acknowledged, found = run_once(mode, args.seconds, args.fsync_delay_ms, preload, workdir)
                print(f"{mode:9} run {run}: {acknowledged} writes acknowledged, {found} after the restart, "
                      f"{acknowledged - found} lost")  # fmt: skip


if __name__ == "__main__":
    main()
