"""Test hosts on one machine: network namespaces on one private Ethernet segment.

``make_hosts(n, tag)`` gives ``n`` "hosts", each a network namespace with an address of its own on a /24 that
this machine (the host namespace) is on too, at ``.1``::

    with make_hosts(3, "ray") as hosts:
        hosts.bridge_ip   # "10.233.17.1": this machine's address on the segment (its servers listen here)
        hosts.ips         # ["10.233.17.2", "10.233.17.3", "10.233.17.4"]
        hosts.namespaces  # ["wsnet-ray-4242-1-1", ...] (for ``ip netns exec``, ``ip -n``)
        hosts.run(0, ["ip", "-4", "-o", "addr"])  # subprocess.run in host 0 (text captured, 30 s limit)
        p = hosts.popen(1, ["python", "-m", "x"], start_new_session=True)  # subprocess.Popen in host 1
        hosts.cut(1)      # host 1 drops off the network (its link goes down); its loopback still works
        hosts.restore(1)  # and comes back (link up, default route put back)

Every namespace has loopback up, its end of a veth pair named ``eth0`` with ``.2``, ``.3``, ... and a default
route via ``.1``; namespaces reach each other and this machine, and this machine reaches them. Processes
started with ``run``/``popen`` (and all their children) live in that namespace; everything else (files, pids,
the hostname, Unix sockets on the file system, /sys, cgroups) is shared with this machine.

Layout: the bridge does not live in the host namespace but in a namespace of its own (``<prefix>-sw``), and
this machine is joined to it by a veth pair like the hosts are. Frames switched by a bridge in the host
namespace go through the host's iptables FORWARD chain whenever ``net.bridge.bridge-nf-call-iptables`` is 1,
and Docker sets that chain's policy to DROP: host-to-namespace traffic would work, but namespace-to-namespace
traffic would silently vanish. A private namespace has empty tables, so nothing there filters, and the host's
firewall is never touched.

Needs root and ``ip`` (iproute2): ``make_hosts`` calls ``pytest.skip`` with the reason otherwise, or when the
kernel refuses a namespace. ``close()`` (the context manager's exit) removes all it made, also after failures;
processes still running inside a host's namespace are SIGKILLed first (``close(kill=False)`` leaves them: a
namespace then lives on, unnamed, until they end). Processes started with ``popen`` should still be ended
(and waited for) by whoever started them, more gently, before that. Namespaces left behind by a run that was
killed outright are removed, with what still runs in them, by the next ``make_hosts`` (``sweep_stale``) once
the process that made them is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest

MARK = "wsnet"  # every namespace made here is named "wsnet-<tag>-<pid>-<seq>-<i|sw>"
SUBNET_PREFIX = "10.233"
_STALE = re.compile(rf"^{MARK}-[a-z0-9]+-(\d+)-\d+-(?:sw|\d+)$")
_seq = itertools.count(1)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _pid_alive(pid: int) -> bool:
    from agent_envs.cluster import _alive  # the local cluster's check: a zombie is not alive either

    return _alive(pid)


def netns_names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sweep_stale() -> list[str]:
    """Delete the namespaces made here by processes that no longer exist (killing what still runs inside
    them); returns their names."""
    removed = []
    for name in netns_names():
        match = _STALE.match(name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            leftover = _ip("netns", "pids", name, check=False).stdout.split()  # still running in it
            for pid in leftover:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            if _ip("netns", "del", name, check=False).returncode == 0:
                removed.append(name)
    return removed


def _free_subnet(start: int) -> str:
    """``10.233.<k>`` with no address or route of this machine inside it."""
    used = _ip("-4", "-o", "addr", "show", check=False).stdout
    used += _ip("-4", "route", "show", check=False).stdout
    for step in range(250):
        subnet = f"{SUBNET_PREFIX}.{(start + step) % 250 + 1}"
        if f" {subnet}." not in used:
            return subnet
    raise RuntimeError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16")


@dataclass
class Hosts:
    """``n`` namespaces on one bridge; see the module's docstring. Made by ``make_hosts``."""

    tag: str
    bridge_ip: str = ""
    namespaces: list[str] = field(default_factory=list)
    ips: list[str] = field(default_factory=list)
    switch: str = ""  # the namespace holding the bridge
    host_link: str = ""  # this machine's end of its veth pair (holds bridge_ip)
    prefix_len: int = 24
    _made: list[str] = field(default_factory=list, repr=False)  # namespaces, in creation order

    def argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` in host ``i``: ``nsenter --net=/run/netns/<ns> -- argv``.

        Only the network namespace changes (nsenter execs ``argv``: a Popen's pid is the program's).
        ``ip netns exec`` would also mount a fresh /sys in a mount namespace of its own, which hides
        /sys/fs/cgroup (slurmd then refuses to start: "No filesystem mounted on /sys/fs/cgroup"); it is the
        fallback where nsenter is missing.
        """
        ns = self.namespaces[i]
        if shutil.which("nsenter"):
            return ["nsenter", f"--net=/run/netns/{ns}", "--", *argv]
        return ["ip", "netns", "exec", ns, *argv]

    def run(self, i: int, argv: Sequence[str], check: bool = False, timeout: float = 30, **kwargs):
        """``subprocess.run`` of ``argv`` in host ``i``; output captured as text unless told otherwise."""
        kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(i, argv), check=check, timeout=timeout, **kwargs)

    def popen(self, i: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """``subprocess.Popen`` of ``argv`` in host ``i`` (the pid is the program's)."""
        return subprocess.Popen(self.argv(i, argv), **kwargs)

    def cut(self, i: int) -> None:
        """Host ``i`` drops off the network: its ``eth0`` goes down (nothing in or out; loopback stays)."""
        _ip("-n", self.namespaces[i], "link", "set", "eth0", "down")

    def restore(self, i: int) -> None:
        """Undo ``cut(i)``: link up, and the default route (removed with the link) back."""
        ns = self.namespaces[i]
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "route", "replace", "default", "via", self.bridge_ip)

    def pids(self, i: int) -> list[int]:
        """The processes living in host ``i``'s namespace now."""
        out = _ip("netns", "pids", self.namespaces[i], check=False).stdout
        return [int(pid) for pid in out.split()]

    def kill_all(self, i: int, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every process in host ``i``'s namespace (all started there by this test); returns
        their pids."""
        pids = self.pids(i)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def close(self, kill: bool = True) -> None:
        """Delete the namespaces (their veth ends go with them), this machine's veth and the switch.

        With ``kill`` (the default) processes still inside a host's namespace are SIGKILLed first (only what
        was started in it: the namespace was made here), so that it really goes away. Idempotent.
        """
        if kill:
            for i in range(len(self.namespaces)):
                if self.namespaces[i] in self._made and self.kill_all(i):
                    deadline = time.monotonic() + 5
                    while self.pids(i) and time.monotonic() < deadline:
                        time.sleep(0.05)
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        if self.host_link:
            _ip("link", "del", self.host_link, check=False)  # normally gone with the switch already
            self.host_link = ""

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _add_netns(hosts: Hosts, name: str) -> None:
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        hosts.close()
        pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
    hosts._made.append(name)
    _ip("-n", name, "link", "set", "lo", "up")


def _build(hosts: Hosts, n: int, seq: int) -> None:
    pid = os.getpid()
    base = f"{MARK}-{hosts.tag}-{pid}-{seq}"
    short = f"ws{pid % 10000}x{seq % 100}"  # interface names: at most 15 characters
    subnet = _free_subnet(pid + 37 * seq)
    hosts.bridge_ip = f"{subnet}.1"
    hosts.switch = f"{base}-sw"
    _add_netns(hosts, hosts.switch)
    bridge = f"{short}b"
    _ip("-n", hosts.switch, "link", "add", bridge, "type", "bridge")
    _ip("-n", hosts.switch, "link", "set", bridge, "up")

    def plug(outer: str, into: str | None, port: str, addr: str | None) -> None:
        """A veth pair: ``port`` on the bridge, ``outer`` in namespace ``into`` (None: this machine)."""
        _ip("link", "add", outer, "type", "veth", "peer", "name", port)
        if into is None:
            hosts.host_link = outer
        _ip("link", "set", port, "netns", hosts.switch)
        _ip("-n", hosts.switch, "link", "set", port, "master", bridge, "up")
        if into is not None:
            _ip("link", "set", outer, "netns", into)
        where = ["-n", into] if into else []
        if into is not None:
            _ip(*where, "link", "set", outer, "name", "eth0")
            outer = "eth0"
        if addr:
            _ip(*where, "addr", "add", f"{addr}/{hosts.prefix_len}", "dev", outer)
        _ip(*where, "link", "set", outer, "up")

    plug(f"{short}h", None, f"{short}ph", hosts.bridge_ip)
    for i in range(1, n + 1):
        ns = f"{base}-{i}"
        _add_netns(hosts, ns)
        ip = f"{subnet}.{i + 1}"
        plug(f"{short}v{i}", ns, f"{short}p{i}", ip)
        _ip("-n", ns, "route", "add", "default", "via", hosts.bridge_ip)
        hosts.namespaces.append(ns)
        hosts.ips.append(ip)


@contextlib.contextmanager
def make_hosts(n: int, tag: str = "h") -> Iterator[Hosts]:
    """``n`` test hosts (see the module's docstring); skips the test where namespaces cannot be made.

    ``tag`` (lowercase letters and digits) goes into the namespaces' names, to tell whose they are.
    """
    if not re.fullmatch(r"[a-z0-9]{1,12}", tag):
        raise ValueError(f"tag must be 1-12 lowercase letters or digits, not {tag!r}")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("`ip` (iproute2) is not installed")
    sweep_stale()
    hosts = Hosts(tag=tag)
    try:
        _build(hosts, n, next(_seq))
        yield hosts
    finally:
        hosts.close()
