"""An environment package from outside the project, added with no edit to it: installed from a temporary copy of
tests/fixtures/plugins/guess-env (pip, into a directory of its own on PYTHONPATH: a real dist-info with the
``agent_envs`` entry point), it is served by `make up-local`'s topology (``python -m agent_envs.cluster up``: real
replicas, nginx and Redis) beside WebShop, through the balancer on its native and AgentGym routes, gets its data
built (`agent-train data --env guess`) and is evaluated (`agent-train eval --env guess --policy expert`), each
command finding the package's registration, core and trainer spec through the entry point alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from _support import SECRET

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "tests" / "fixtures" / "plugins" / "guess-env"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin installed by pip from a temporary copy of its source, into a directory of its own."""
    scratch = tmp_path_factory.mktemp("plugin")
    source, site = scratch / "guess-env", scratch / "site"
    shutil.copytree(PLUGIN, source)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(source)],
        check=True, timeout=300,
    )  # fmt: skip
    assert (
        (next(site.glob("guess_env-*.dist-info")) / "entry_points.txt").read_text().startswith("[agent_envs]")
    )
    return site


@pytest.fixture(scope="module")
def plugin_env(plugin_site: Path) -> dict[str, str]:
    """The environment of every command: the plugin's directory on PYTHONPATH, nothing else of it anywhere."""
    path = os.pathsep.join([str(plugin_site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "AGENTRL_STATE_SECRET": SECRET}


@pytest.fixture(scope="module")
def served(plugin_env: dict[str, str], conformance_catalog_dir: Path, tmp_path_factory) -> Iterator[dict]:
    """`make up-local ENVS=webshop,guess`: the cluster's own command line, with free ports."""
    run_dir = tmp_path_factory.mktemp("plugin-cluster")
    up = subprocess.run(
        [sys.executable, "-m", "agent_envs.cluster", "up", "--replicas", "2", "--workers", "2", "--catalog",
         str(conformance_catalog_dir), "--base-port", "0", "--port", "0", "--run-dir", str(run_dir), "--json",
         "--timeout", "180"],
        env={**plugin_env, "AGENTRL_ENVS": "webshop,guess"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        yield json.loads(up.stdout)
    finally:
        subprocess.run([sys.executable, "-m", "agent_envs.cluster", "down", "--run-dir", str(run_dir)],
                       env=plugin_env, capture_output=True, timeout=120)  # fmt: skip


def test_the_project_does_not_name_the_plugin() -> None:
    """Nothing of the project lists the plugin: only its own folder and this test mention its package."""
    found = subprocess.run(
        ["git", "grep", "-l", "guess_env", "--", "."], cwd=REPO, capture_output=True, text=True
    )
    if found.returncode not in (0, 1):
        pytest.skip("not a git checkout")
    mentions = {line for line in found.stdout.splitlines() if not line.startswith("tests/fixtures/plugins/")}
    assert mentions <= {"tests/integration/test_plugin_env.py"}, mentions


def test_a_plugin_is_served_through_the_balancer(served: dict) -> None:
    """Native (any replica, the state in the token) and AgentGym routes (by session, in Redis) of the plugin, its
    balancer routes rendered from its registration, and WebShop at the root beside it."""
    from agent_envs.client.envs import EnvClient

    conf = Path(served["run_dir"]) / "nginx" / "nginx.conf"
    assert "        location /guess/ {" in conf.read_text()
    assert [r["envs"] for r in served["replicas"]] == ["webshop,guess", "webshop,guess"]
    url = served["url"]

    import asyncio

    async def native() -> tuple[dict, list[str]]:
        async with EnvClient(url, "guess", timeout=30) as client:
            assert (await client.info())["tasks"] == 200
            result, actions = await client.reset(5), await client.expert(5)
            for action in actions:
                result = await client.step(result["state"], action)
            return result, actions

    final, actions = asyncio.run(native())
    assert (final["observation"], final["reward"], final["done"]) == ("Correct!", 1.0, True)
    assert actions[-1] == "guess 86"  # task 5's number: 37 * 5 % 100 + 1
    with httpx.Client(base_url=url, timeout=30) as http:
        created = http.post("/guess/create").json()
        session = created["id"]
        assert http.post("/guess/reset", json={"id": session, "data_idx": 5}).json()["done"] is False
        for action in actions:
            answer = http.post("/guess/step", json={"id": session, "action": action}).json()
        assert answer == {"observation": "Correct!", "reward": 1.0, "done": True}
        assert http.get("/guess/observation", params={"id": session}).json() == "Correct!"
        assert http.post("/guess/close", json={"id": session}).json() is True
        assert http.post("/guess/step", json={"id": session, "action": "guess 1"}).json() == {
            "error": f"The id {session} is not valid."
        }
        assert http.get("/v1/info").json()["fingerprint"]  # WebShop's own routes, at the root, as always
    access = (Path(served["run_dir"]) / "logs" / "nginx-access.log").read_text()
    assert '"uri":"/guess/step","request":"POST /guess/step HTTP/1.1","status":200' in access


def test_a_plugin_gets_its_data_built_and_is_evaluated(
    served: dict, plugin_env: dict[str, str], tmp_path: Path
) -> None:
    """`agent-train data --env guess` (the plugin's core in process, its spec's split) and `agent-train eval --env
    guess --policy expert` through the balancer (the service's expert, the spec's outcome)."""
    data = subprocess.run(
        [str(BIN / "agent-train"), "data", "--env", "guess", "--out-dir", str(tmp_path / "data"), "--quiet"],
        env=plugin_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert data.returncode == 0, data.stderr
    test_rows = pq.read_table(tmp_path / "data" / "test.parquet").to_pylist()
    assert len(test_rows) == 40 and {row["data_source"] for row in test_rows} == {"guess"}
    assert all(row["extra_info"]["task"] % 5 == 0 for row in test_rows)  # the spec's split
    assert test_rows[0]["prompt"][1]["content"].startswith("Guess the number between 1 and 100")
    for split, rows in (("train", 120), ("val", 40)):
        assert pq.read_metadata(tmp_path / "data" / f"{split}.parquet").num_rows == rows
    evaluated = subprocess.run(
        [str(BIN / "agent-train"), "eval", "--env", "guess", "--policy", "expert", "--url", served["url"],
         "--out", str(tmp_path / "eval"), "--max-samples", "8", "--no-progress"],
        env=plugin_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["episodes"] == 8 and metrics["success_rate"] == 1.0, metrics
