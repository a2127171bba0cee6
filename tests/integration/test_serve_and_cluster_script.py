"""``serve`` / ``bench-http`` as real processes, and the local-cluster script's own behaviour."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests
from _support import SECRET, Replica, metric_value

from agent_envs.cli.serve import add_commands

SERVE = [sys.executable, "-m", "agent_envs.cli"]


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=timeout, env=env)


def env_without_secret() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_"))}


def test_add_commands_wires_into_a_parser() -> None:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", "1234", "--workers", "2"])
    assert (args.command, args.port, args.workers) == ("serve", 1234, 2)
    args = parser.parse_args(
        ["bench-http", "--url", "http://x", "--concurrency", "3", "--episodes", "4", "--json"]
    )
    assert (args.concurrency, args.episodes) == (3, 4)


def test_serve_refuses_to_start_without_a_secret(conformance_catalog_dir: Path) -> None:
    result = run(
        ["serve", "--catalog", str(conformance_catalog_dir), "--port", "1"], env=env_without_secret()
    )
    assert result.returncode == 2
    assert (
        "AGENTRL_STATE_SECRET is not set" in result.stderr
        and "AGENTRL_ALLOW_EPHEMERAL_SECRET" in result.stderr
    )


def test_serve_reports_a_missing_secret_and_a_missing_catalog_at_once(tmp_path: Path) -> None:
    result = run(
        ["serve", "--catalog", str(tmp_path / "nonexistent"), "--port", "1"], env=env_without_secret()
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 2, result.stderr
    assert "AGENTRL_STATE_SECRET is not set" in errors[0] and "not a prepared catalog" in errors[1]


def test_serve_refuses_a_directory_that_is_no_catalog(tmp_path: Path) -> None:
    result = run(
        ["serve", "--catalog", str(tmp_path), "--port", "1"],
        env={**os.environ, "AGENTRL_STATE_SECRET": SECRET},
    )
    assert result.returncode == 2 and "not a prepared catalog" in result.stderr


def test_serve_refuses_sciworld_without_java(tmp_path: Path) -> None:
    """SciWorld's start check: with no `java` on PATH the replica would come up and answer every SciWorld request
    503 for good (its JVM pool keeps trying), so `serve` stops first and says what to install."""
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run(
        ["serve", "--envs", "sciworld", "--port", "1"],
        env={**os.environ, "AGENTRL_STATE_SECRET": SECRET, "PATH": str(empty)},
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "sciworld: no `java` on PATH" in result.stderr and "openjdk-17" in result.stderr


def test_bench_http_prints_one_json_object(cluster) -> None:
    result = run(["bench-http", "--url", cluster["url"], "--concurrency", "8", "--episodes", "24", "--json"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    figures = json.loads(lines[0])
    for key in ("steps_per_s", "p50_ms", "p99_ms", "errors", "episodes", "steps", "concurrency", "seconds"):
        assert key in figures
    assert figures["errors"] == 0 and figures["episodes"] == 24 and figures["concurrency"] == 8
    assert figures["steps"] > 24 and figures["steps_per_s"] > 0


def test_two_workers_share_an_ephemeral_secret_and_metrics(
    conformance_catalog_dir: Path, tmp_path: Path
) -> None:
    """One replica, 2 worker processes, no AGENTRL_STATE_SECRET: every token works on either worker."""
    env = {**env_without_secret(), "AGENTRL_ALLOW_EPHEMERAL_SECRET": "1"}
    replica = Replica(conformance_catalog_dir, tmp_path / "replica.log", workers=2, base_env=env)
    try:
        session = requests.Session()
        state = session.post(replica.url + "/v1/reset", json={"goal": 4}, timeout=10).json()["state"]
        sent = 0
        step_pids: set[int] = set()
        while len(step_pids) < 2 and sent < 600:  # fresh connections land on either worker (bounded)
            for _ in range(20):
                response = requests.post(replica.url + "/v1/step", json={"state": state, "action": "search[sofa]"},
                                         timeout=10)  # fmt: skip
                assert response.status_code == 200, response.text
                sent += 1
            records = [
                json.loads(line) for line in replica.log_path.read_text().splitlines() if line.startswith("{")
            ]
            step_pids = {r["pid"] for r in records if r.get("path") == "/v1/step"}
        assert len(step_pids) == 2, "the second worker never took a step"
        metrics = requests.get(replica.url + "/metrics", timeout=10).text
        served = metric_value(metrics, "agentrl_env_steps_total", {"env": "webshop", "api": "native"})
        assert served == sent  # aggregated over both workers (prometheus multiprocess mode)
        assert "EPHEMERAL" in replica.log_path.read_text()
    finally:
        replica.stop()


def test_workers_slow_to_start_are_given_time_not_killed(
    conformance_catalog_dir: Path, tmp_path: Path
) -> None:
    """uvicorn's supervisor kills a worker that has not answered its liveness ping within 5 s, and a worker answers
    only once its interpreter has started; on a loaded machine that takes longer, and the replica's workers were
    killed and restarted over and over (compose replicas never healthy). Here every worker interpreter's start
    is slowed by 7 s (a sitecustomize that sleeps in multiprocessing's spawned children only): the replica must
    still get ready, with no worker restarted."""
    slow = tmp_path / "slow-start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sys, time\nif '--multiprocessing-fork' in sys.argv:\n    time.sleep(7)\n"
    )
    pythonpath = os.pathsep.join(filter(None, [str(slow), os.environ.get("PYTHONPATH", "")]))
    replica = Replica(
        conformance_catalog_dir, tmp_path / "replica.log", workers=2, env={"PYTHONPATH": pythonpath}
    )
    try:
        log = replica.log_path.read_text()
        assert "died" not in log and "Child process" not in log, log[-2000:]
    finally:
        replica.stop()


# ---- agent_envs.cluster ----------------------------------------------------------------------------
def test_nginx_template_renders_and_passes_nginx_t_as_non_root(local_cluster) -> None:
    with tempfile.TemporaryDirectory(prefix="webshop-nginx-") as directory:  # pytest's tmp dirs are root-only
        os.chmod(directory, 0o777)
        _check_template(local_cluster, Path(directory))


def _check_template(local_cluster, runtime: Path) -> None:
    conf = runtime / "nginx.conf"
    conf.write_text(
        local_cluster.render_nginx_conf(
            {
                "AGENTRL_UPSTREAMS": "        server 127.0.0.1:1 max_fails=3 fail_timeout=5s;\n"
                "        server 127.0.0.1:2 max_fails=3 fail_timeout=5s;",
                "AGENTRL_LISTEN_PORT": "127.0.0.1:8080",
                "AGENTRL_NGINX_RUNTIME_DIR": str(runtime),
                "AGENTRL_NGINX_ACCESS_LOG": str(runtime / "access.log"),
                "AGENTRL_NGINX_ERROR_LOG": str(runtime / "error.log"),
            }
        )
    )
    text = conf.read_text()
    assert "${AGENTRL_" not in text and "$upstream_addr" in text and "least_conn;" in text
    command = [local_cluster.nginx_binary(), "-t", "-p", str(runtime), "-c", str(conf)]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


def test_render_refuses_missing_values(local_cluster) -> None:
    with pytest.raises(local_cluster.ClusterError, match="AGENTRL_LISTEN_PORT"):
        local_cluster.render_nginx_conf({"AGENTRL_UPSTREAMS": "server a:1;"})


def test_missing_nginx_says_how_to_install_it(
    local_cluster, monkeypatch, conformance_catalog_dir, tmp_path
) -> None:
    monkeypatch.setattr(local_cluster.shutil, "which", lambda name: None)
    monkeypatch.setattr(local_cluster.os, "access", lambda path, mode: False)
    with pytest.raises(local_cluster.ClusterError, match=r"nginx not found: run `make nginx`"):
        local_cluster.up(catalog=conformance_catalog_dir, run_dir=tmp_path, quiet=True)
    assert (
        local_cluster.main(["up", "--catalog", str(conformance_catalog_dir), "--run-dir", str(tmp_path)]) == 1
    )


def test_cluster_status_and_double_up(local_cluster, cluster, conformance_catalog_dir, capsys) -> None:
    run_dir = Path(cluster["run_dir"])
    record = local_cluster.status(run_dir)
    assert record is not None and all(r["alive"] and r["ready"] for r in record["replicas"])
    assert record["nginx"]["ready"]
    with pytest.raises(local_cluster.ClusterError, match="already running"):
        local_cluster.up(catalog=conformance_catalog_dir, run_dir=run_dir, quiet=True)
    assert local_cluster.main(["status", "--run-dir", str(run_dir)]) == 0
    assert cluster["url"] in capsys.readouterr().out


def test_down_without_a_cluster_is_harmless(local_cluster, tmp_path: Path) -> None:
    assert local_cluster.down(tmp_path, quiet=True) == []
    assert local_cluster.status(tmp_path) is None
