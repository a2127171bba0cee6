"""The AgentGym session store (Redis) restarted or crashed under 32 AgentGym clients mid-episode (issue 22).

The store of ``make up-local`` keeps an append-only file in the cluster's run directory. This module runs it
with ``SESSIONS_APPENDFSYNC=always`` (written and fsynced before each answer): "a crash of the store loses no
answered step" is that setting's promise. Under the default ``everysec`` Redis postpones its write while its
last fsync is still running and answers all the same, so a SIGKILL then can lose answered steps (CI once saw
one, docs/reliability.md). Each test stops it while every client is half-way through an expert episode, keeps
it down for a second, then starts it again from its data directory:

- while it is down, the API answers 503 ``session_store_down`` with ``Retry-After`` (not 404 ``unknown_env``);
- every client (retrying 503s with backoff, each step under an ``Idempotency-Key``) finishes its episode with
  the observations, rewards and ``done`` the native protocol gives for the same actions: no acknowledged step
  is lost and none is applied twice.

Cases: a clean restart (SIGTERM), a crash (SIGKILL), and a crash together with a SIGKILL of a replica. And a
hung store (SIGSTOP): the replicas give up on it within their deadline (1.5 s), so the client gets their 503
``session_store_down``, not the balancer's timeout (2 s).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from _agentgym import AgentGymClient, episodes_across
from _faults import figure, native_trace, signal_replica, start

from agent_envs import cluster

CLIENTS = 32
DOWN_S = 1.0  # how long the store stays down


@pytest.fixture(scope="module")
def store_cluster(conformance_catalog_dir, tmp_path_factory):
    record = start(
        conformance_catalog_dir,
        tmp_path_factory.mktemp("session-store"),
        env={"SESSIONS_APPENDFSYNC": "always"},
    )
    try:
        command = record["redis"]["command"]
        assert command[command.index("--appendfsync") + 1] == "always", command
        yield record
    finally:
        cluster.down(record["run_dir"], quiet=True)


@pytest.fixture(scope="module")
def native(store_cluster, expert_plans) -> dict[int, list[tuple[str, float, bool]]]:
    """goal -> what the native protocol answers to the expert's actions, step by step."""
    goals = list(expert_plans)[:CLIENTS]
    return {goal: native_trace(store_cluster["url"], goal, expert_plans[goal]) for goal in goals}


CASES = [
    pytest.param(signal.SIGTERM, False, "a restart (SIGTERM)", id="restart"),
    pytest.param(signal.SIGKILL, False, "a crash (SIGKILL)", id="crash"),
    # last: it kills replica 0 of the module's cluster
    pytest.param(
        signal.SIGKILL, True, "a crash (SIGKILL) with a replica SIGKILLed too", id="crash-and-replica"
    ),
]


@pytest.mark.parametrize(("stop_sig", "kill_replica", "what"), CASES)
def test_store_outage_loses_no_acknowledged_step(
    store_cluster, expert_plans, native, stop_sig, kill_replica, what
) -> None:
    url, run_dir = store_cluster["url"], store_cluster["run_dir"]
    idle = AgentGymClient(url, timeout=30)  # a session that makes no step during the outage
    idle.reset(0)

    def outage() -> list[tuple[int, str | None, str | None]]:
        if kill_replica:
            signal_replica(store_cluster, 0, signal.SIGKILL)
        cluster.stop_sessions(run_dir, stop_sig)
        stopped = time.monotonic()
        probed = idle.probe()
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - stopped)))
        cluster.start_sessions(run_dir)
        return probed

    plans = {goal: expert_plans[goal] for goal in native}
    traces, retries, probed = episodes_across(url, plans, outage)
    equal = sum(traces[goal] == native[goal] for goal in native)
    rewarded = sum(traces[goal][-1][1:] == native[goal][-1][1:] for goal in native)
    figure(
        f"AgentGym session store: {what}, down {DOWN_S:.0f} s under {CLIENTS} clients mid-episode: {equal}/"
        f"{CLIENTS} episodes equal to the native protocol step by step ({rewarded} with its final reward), "
        f"{retries} client retries; while down, a step and an observation answered {probed}"
    )
    # while the store was down: a retryable 503 that says so, never "your session is gone"; with a replica killed
    # at the same moment, a probe may also meet the balancer's own retryable 503 for the dead replica
    allowed = {"session_store_down", "upstream_unavailable"} if kill_replica else {"session_store_down"}
    for status, error, retry_after in probed:
        assert status == 503 and error in allowed and retry_after is not None, probed
    assert any(error == "session_store_down" for _, error, _ in probed) or kill_replica, probed
    assert retries > 0, "no client met the outage: the test did not test it"
    assert equal == CLIENTS, {goal: traces[goal] for goal in native if traces[goal] != native[goal]}
    assert idle.observe().startswith("WebShop [SEP]")  # the idle session survived too


def test_a_hung_store_answers_503_session_store_down(store_cluster) -> None:
    """A frozen store (SIGSTOP) accepts connections and never answers: each replica's deadline per store call
    (below nginx's 2 s read timeout) turns that into its own 503 session_store_down; then it serves again."""
    client = AgentGymClient(store_cluster["url"], timeout=30)
    client.reset(0)
    store = cluster.status(store_cluster["run_dir"])["redis"]
    os.killpg(store["pgid"], signal.SIGSTOP)
    try:
        probed = client.probe()
    finally:
        os.killpg(store["pgid"], signal.SIGCONT)
    figure(f"AgentGym session store frozen (SIGSTOP): a step and an observation answered {probed}")
    for status, error, retry_after in probed:
        assert (status, error) == (503, "session_store_down") and retry_after is not None, probed
    assert client.observe().startswith("WebShop [SEP]")
