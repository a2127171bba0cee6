"""``agent-envs bench-envs`` runs every path it reports, for real (a local cluster: real replicas behind nginx):
in process, native and AgentGym's requests through the balancer, and SciWorld's warm-pool and cold-JVM resets;
with ``--agentgym``, our one process and the deployed cluster beside a server of AgentGym's protocol (here the
cluster's own routes stand in for AgentGym's server). It checks that every row measured something without
errors, never the figures themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support import start_cluster

from agent_envs.envs import bench, bench_agentgym

pytestmark = pytest.mark.slow


def test_every_row_is_measured(local_cluster, conformance_catalog_dir: Path, tmp_path: Path) -> None:
    record = start_cluster(local_cluster, conformance_catalog_dir, tmp_path / "run",
                           env={"AGENTRL_ENVS": "textcraft,sciworld", "SCIWORLD_SPARE_JVMS": "1"})  # fmt: skip
    try:
        rows = bench.run(["textcraft", "sciworld"], 2, 2, record["url"])
    finally:
        local_cluster.down(tmp_path / "run", quiet=True)
    paths = [(row["env"], row["path"].split(" (")[0]) for row in rows]
    assert paths == [
        ("textcraft", "in process"), ("sciworld", "in process"),
        ("sciworld", "reset, warm pool"), ("sciworld", "reset, cold JVM: AgentGym's /create + /reset"),
        ("textcraft", "native over HTTP"), ("textcraft", "AgentGym routes over HTTP"),
        ("sciworld", "native over HTTP"), ("sciworld", "AgentGym routes over HTTP"),
    ]  # fmt: skip
    for row in rows:
        assert row.get("errors", 0) == 0 and isinstance(row["load"], float), row
        assert row["steps"] > 0 or row["path"].startswith("reset"), row
        assert isinstance(row["reset"]["p50_ms"], float), row
    table = bench.markdown(rows)
    assert table.count("\n| ") == len(rows) + 1 and "load average" in table


def test_beside_agentgym_every_server_is_measured(
    local_cluster, conformance_catalog_dir: Path, tmp_path: Path
) -> None:
    record = start_cluster(local_cluster, conformance_catalog_dir, tmp_path / "run",
                           env={"AGENTRL_ENVS": "textcraft"})  # fmt: skip
    try:
        rows = bench_agentgym.compare(["textcraft"], {"textcraft": f"{record['url']}/textcraft"}, clients=(1, 2),
                                      rounds=2, episodes=1, url=record["url"])  # fmt: skip
    finally:
        local_cluster.down(tmp_path / "run", quiet=True)
    assert [(row["clients"], row["server"]) for row in rows] == [
        (n, server)
        for n in (1, 2)
        for server in (bench_agentgym.ONE, bench_agentgym.DEPLOYED, bench_agentgym.AGENTGYM)
    ]
    for row in rows:
        assert row["errors"] == 0 and row["steps"] > 0 and isinstance(row["step"]["p50_ms"], float), row
    assert bench_agentgym.markdown(rows).count("\n| textcraft |") == len(rows)


def test_default_environments_follow_webshop_envs(monkeypatch) -> None:
    monkeypatch.setenv("AGENTRL_ENVS", "webshop,sciworld, babyai")
    assert bench.default_envs() == "sciworld,babyai"
    monkeypatch.setenv("AGENTRL_ENVS", "webshop")
    assert bench.default_envs() == "textcraft,babyai"
