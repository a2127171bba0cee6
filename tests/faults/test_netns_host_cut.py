"""A replica HOST that drops off the network: two replicas, each on a host of its own (a network namespace
made by this test, joined to this one by a veth pair; only loopback and those namespaces are involved), one
nginx in front. While 64 episodes run concurrently, host 1 starts dropping every packet, in and out (no RST,
no ICMP: iptables DROP inside its namespace, or its link set down where iptables is missing), and stays cut
off for longer than the balancer's fail_timeout. No episode is lost.

Needs root and ``ip`` (iproute2); skips with the reason otherwise. Everything it creates is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _faults import CONCURRENT, SECRET, figure, run_slots

from agent_envs import cluster

CUT_AFTER_S = 0.4
CUT_RUN_S = 14.0
PORT = 8000


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture
def two_hosts(conformance_catalog_dir: Path, tmp_path: Path):
    """Namespaces ``h12-<pid>-1/2`` with 10.231.<n>.2, each running one replica; yields (ips, namespaces)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("`ip` (iproute2) is not installed")
    tag = f"wsf{os.getpid() % 100000}"
    namespaces, links, replicas = [], [], []
    try:
        for n in (1, 2):
            ns, host_end, ns_end = f"{tag}-{n}", f"{tag}h{n}", f"{tag}n{n}"
            made = sh("ip", "netns", "add", ns, check=False)
            if made.returncode != 0:
                pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
            namespaces.append(ns)
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            links.append(host_end)
            sh("ip", "link", "set", ns_end, "netns", ns)
            sh("ip", "addr", "add", f"10.231.{n}.1/24", "dev", host_end)
            sh("ip", "link", "set", host_end, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.231.{n}.2/24", "dev", ns_end)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        env = {**os.environ, "AGENTRL_STATE_SECRET": SECRET, "AGENTRL_WATCHDOG_INTERVAL_S": "0"}
        env.pop("AGENTRL_REDIS_URL", None)
        for n, ns in enumerate(namespaces, start=1):
            log = open(tmp_path / f"replica-{n}.log", "wb")  # noqa: SIM115 (closed with the process)
            replicas.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, sys.executable, "-m", "agent_envs.cli", "serve",
                     "--catalog", str(conformance_catalog_dir), "--host", f"10.231.{n}.2", "--port", str(PORT),
                     "--workers", "1"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                    start_new_session=True,
                )
            )  # fmt: skip
        ips = [f"10.231.{n}.2" for n in (1, 2)]
        deadline = time.monotonic() + 90
        while not all(cluster.http_status(f"http://{ip}:{PORT}/readyz") == 200 for ip in ips):
            if time.monotonic() > deadline or any(p.poll() is not None for p in replicas):
                logs = "\n".join((tmp_path / f"replica-{n}.log").read_text()[-1500:] for n in (1, 2))
                pytest.fail(f"the namespaced replicas did not get ready:\n{logs}")
            time.sleep(0.2)
        yield ips, namespaces
    finally:
        for process in replicas:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        for link in links:
            sh("ip", "link", "del", link, check=False)
        for ns in namespaces:
            sh("ip", "netns", "del", ns, check=False)


def start_nginx(ips: list[str], run_dir: Path) -> tuple[subprocess.Popen, str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    port = cluster.free_ports(1)[0]
    upstreams = "        zone env_upstreams 256k;\n" + "\n".join(
        f"        server {ip}:{PORT} max_fails=1 fail_timeout=10s;" for ip in ips
    )
    conf = run_dir / "nginx.conf"
    conf.write_text(
        cluster.render_nginx_conf(
            {
                "AGENTRL_UPSTREAMS": upstreams,
                "AGENTRL_LISTEN_PORT": f"127.0.0.1:{port}",
                "AGENTRL_NGINX_RUNTIME_DIR": str(run_dir),
                "AGENTRL_NGINX_ACCESS_LOG": str(run_dir / "access.log"),
                "AGENTRL_NGINX_ERROR_LOG": str(run_dir / "error.log"),
            }
        )
    )
    process = subprocess.Popen(
        [cluster.nginx_binary(), "-p", str(run_dir), "-c", str(conf)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while cluster.http_status(url + "/nginx-health") != 200:
        assert process.poll() is None and time.monotonic() < deadline, (run_dir / "error.log").read_text()
        time.sleep(0.1)
    return process, url


def cut_off(namespace: str) -> str:
    """Drop every packet of the host, both ways; returns how."""
    if shutil.which("iptables"):
        rules = [("INPUT", "-j", "DROP"), ("OUTPUT", "-j", "DROP")]
        done = [
            sh("ip", "netns", "exec", namespace, "iptables", "-I", chain, *rest, check=False)
            for chain, *rest in rules
        ]
        if all(result.returncode == 0 for result in done):
            return "iptables DROP in and out"
    link = next(
        line.split(":")[1].strip().split("@")[0]
        for line in sh("ip", "netns", "exec", namespace, "ip", "-o", "link").stdout.splitlines()
        if "veth" in line or "@" in line
    )
    sh("ip", "netns", "exec", namespace, "ip", "link", "set", link, "down")
    return f"link {link} down"


def test_replica_host_cut_off_loses_no_episode(two_hosts, expert_plans, tmp_path: Path) -> None:
    ips, namespaces = two_hosts
    nginx, url = start_nginx(ips, tmp_path / "nginx")
    how = [""]
    try:
        baseline = asyncio.run(run_slots(url, expert_plans, retries=None, seconds=0))
        assert all(r == 1.0 for _, r, _ in baseline), baseline

        async def cut() -> None:
            await asyncio.sleep(CUT_AFTER_S)
            how[0] = cut_off(namespaces[0])

        results = asyncio.run(run_slots(url, expert_plans, retries=0, seconds=CUT_RUN_S, on_started=cut))
        # the host really is unreachable now: a direct request times out
        assert cluster.http_status(f"http://{ips[0]}:{PORT}/healthz", timeout=1.0) is None
    finally:
        os.killpg(nginx.pid, signal.SIGTERM)
        nginx.wait(10)

    lost = [(g, r) for g, r, _ in results if r != 1.0]
    base = {g: t for g, _, t in baseline}
    times = [t for _, _, t in results]
    delays = [t - base[g] for g, _, t in results]
    figure(
        f"netns: 1 of 2 replica hosts cut off ({how[0]}) for {CUT_RUN_S - CUT_AFTER_S:.0f} s under {CONCURRENT} "
        f"concurrent episodes ({len(results)} episodes, client without retries): {len(lost)} lost; episode time "
        f"median {statistics.median(times):.2f} s, worst {max(times):.2f} s; worst delay {max(delays):.2f} s"
    )
    assert not lost, lost[:3]
