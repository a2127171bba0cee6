"""``agent_envs.cluster.free_ports``: the ports a local cluster hands its replicas and balancer."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agent_envs import cluster


def test_ports_come_from_below_the_kernels_ephemeral_range() -> None:
    """A port the kernel may hand to anyone's next ``bind(0)`` or outgoing connection (a SciWorld JVM's py4j gateway
    took one between our release and the replica's bind) is never picked where the range leaves room below it."""
    pool = cluster.port_pool()
    if pool is None:
        pytest.skip("this kernel's ephemeral range leaves no room below it")
    low = int(cluster.EPHEMERAL_RANGE.read_text().split()[0])
    ports = cluster.free_ports(40)
    assert len(set(ports)) == 40
    assert all(cluster.PORT_POOL_START <= port < low for port in ports), ports


def test_a_taken_port_is_never_handed_out_and_a_full_pool_falls_back(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """With every port of the pool but a few taken, those few come back, then the kernel's own choice."""
    pool_end = cluster.PORT_POOL_START + 1000
    limits = tmp_path / "ip_local_port_range"
    limits.write_text(f"{pool_end}\t60999\n")
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE", limits)
    held: list[socket.socket] = []
    try:
        for port in range(cluster.PORT_POOL_START, pool_end - 3):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # taken by someone else already: taken all the same
                sock.close()
                continue
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        ports = cluster.free_ports(6)
        assert len(set(ports)) == 6 and not taken & set(ports)
        in_pool = [p for p in ports if cluster.PORT_POOL_START <= p < pool_end]
        assert set(in_pool) <= set(range(pool_end - 3, pool_end)) and len(ports) - len(in_pool) >= 3
    finally:
        for sock in held:
            sock.close()


def test_no_pool_where_the_range_cannot_be_read_or_leaves_no_room(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    limits = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE", limits)
    assert cluster.port_pool() is None  # no such file
    limits.write_text("1024\t65535\n")
    assert cluster.port_pool() is None
    assert len(set(cluster.free_ports(3))) == 3  # the kernel's choice
