"""A replica that hangs (SIGSTOP: it holds its port and accepts connections, but never answers) while 64
episodes run concurrently, one of two replicas, frozen for longer than the balancer's fail_timeout (so it is
probed again while still hung): nginx's short upstream timeouts move its requests to the other replica, so no
episode is lost, even with a client that never retries; an episode is delayed by about one upstream read
timeout (2 s) at worst."""

from __future__ import annotations

import asyncio
import signal
import statistics
import time

from _faults import CONCURRENT, figure, run_slots, signal_replica, start

from webshop_env import cluster

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
