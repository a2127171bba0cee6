"""The env as a Ray Serve app on a real 3-node Ray cluster (head + 2 workers, each in a network namespace of
its own on one bridge, started with ``ray start``), deployed by ``agent-envs serve-ray`` with the catalog
staged on every node by Ray tasks.

64 concurrent expert episodes run from all three nodes, each node's client through its own node's Serve proxy
(``http://127.0.0.1:<port>``, the other nodes' proxies as fallbacks, as the trainer's ``AGENTRL_ENV=ray``
does). Mid-run one worker node fails: its Ray processes are SIGKILLed (``kill``), or its link goes down
(``cut``). Every episode completes with the reward the expert's actions earn in-process (what ``agent-envs
solve`` plays), none is lost; the worst step delay is reported.

Needs root and ``ip``; skips with the reason otherwise. Everything it creates is removed.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from _netns import make_hosts
from _raynodes import RayNodes, figure, ray_env

pytestmark = pytest.mark.timeout(600)

PORT = 8000
SLOTS = 64  # episodes in flight at once, over the three nodes
RUN_S = 14.0  # each slot runs episodes back to back this long
FAULT_AFTER_S = 4.0
DRIVE = Path(__file__).with_name("_drive.py")


@pytest.fixture(scope="module")
def expert_plans(conformance_catalog) -> dict[int, tuple[list[str], float]]:
    """Synthetic goals with an expert plan of at least 3 actions: (actions, the reward they earn in-process)."""
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions, run_actions

    env = WebShopEnv(conformance_catalog)
    plans = {}
    for goal in range(400):
        actions = expert_actions(env, goal, "synthetic")
        if actions and len(actions) >= 3:
            plans[goal] = (actions, run_actions(env, goal, actions, "synthetic")[-1].reward)
        if len(plans) >= 96:
            break
    assert len(plans) >= SLOTS
    return plans


@pytest.fixture
def ray_cluster():
    # a short root: Ray's unix sockets live under each node's temp dir (at most 107 bytes for the path)
    root = Path(tempfile.mkdtemp(prefix="wsray-", dir="/tmp"))
    with make_hosts(3, "ray") as hosts:
        nodes = RayNodes(hosts, root)
        try:
            nodes.start()
            yield nodes
        finally:
            nodes.stop()
            shutil.rmtree(root, ignore_errors=True)


def deploy(nodes: RayNodes, catalog: Path, stage_root: Path) -> dict:
    done = nodes.hosts.run(
        0,
        [sys.executable, "-m", "agent_envs.cli", "serve-ray", "--address", nodes.address, "--catalog", str(catalog),
         "--stage-catalog", "--stage-root", str(stage_root), "--port", str(PORT), "--wait", "300"],
        timeout=400, env=ray_env(),
    )  # fmt: skip
    assert done.returncode == 0, f"serve-ray failed:\n{done.stderr[-3000:]}\n{nodes.logs()}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def served_steps(nodes: RayNodes, i: int) -> int:
    """Step requests in node ``i``'s replica logs (Serve's per-request log lines, in the node's own temp dir)."""
    logs = (nodes.root / f"n{i}").glob("session_*/logs/serve/replica_webshop_WebShop_*.log")
    return sum(text.count("/v1/step") for text in (p.read_text(errors="replace") for p in logs))


@pytest.mark.parametrize("fault", ["kill", "cut"])
def test_episodes_survive_a_lost_node(
    ray_cluster: RayNodes, conformance_catalog_dir, expert_plans, tmp_path, fault
):
    nodes, hosts = ray_cluster, ray_cluster.hosts
    report = deploy(nodes, conformance_catalog_dir, tmp_path / "stage")
    assert sorted(n["node_ip"] for n in report["nodes"]) == sorted(hosts.ips)
    assert all(n["replicas"] == 1 and n["readyz"] == 200 for n in report["nodes"]), report

    # What a trainer process on each node (a Ray actor there) uses: its own node's proxy first.
    probe = nodes.driver(
        0,
        "import json, ray\n"
        "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On\n"
        "from agent_envs.ray_serve.nodes import node_proxy_urls\n"
        "ray.init(address=ADDRESS, logging_level='ERROR', log_to_driver=False)\n"
        "f = ray.remote(num_cpus=0)(lambda: (ray.util.get_node_ip_address(), node_proxy_urls(8000)))\n"
        "print(json.dumps(ray.get([f.options(scheduling_strategy=On(n['NodeID'], soft=False)).remote() "
        "for n in ray.nodes() if n['Alive']])))",
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    for ip, urls in json.loads(probe.stdout.strip().splitlines()[-1]):
        assert urls[0] == f"http://127.0.0.1:{PORT}"
        assert sorted(urls[1:]) == sorted(f"http://{other}:{PORT}" for other in hosts.ips if other != ip)

    goals = sorted(expert_plans)
    drivers = []
    for i, ip in enumerate(hosts.ips):
        mine = goals[i::3]
        spec = {
            "urls": [f"http://127.0.0.1:{PORT}"] + [f"http://{o}:{PORT}" for o in hosts.ips if o != ip],
            "plans": {g: expert_plans[g][0] for g in mine},
            "slots": len(range(i, SLOTS, 3)),
            "seconds": RUN_S,
            "think_s": 0.1,
            "timeout": 3.0,
            "budget": 180.0,
        }
        spec_path, out_path = tmp_path / f"spec-{i}.json", tmp_path / f"out-{i}.json"
        spec_path.write_text(json.dumps(spec))
        log = (tmp_path / f"drive-{i}.log").open("wb")
        drivers.append(
            (out_path, hosts.popen(i, [sys.executable, str(DRIVE), str(spec_path), str(out_path)], stdout=log,
                                   stderr=log, env=ray_env()))
        )  # fmt: skip
    time.sleep(FAULT_AFTER_S)
    victim = 2
    started = time.monotonic()
    if fault == "kill":
        nodes.kill_node(victim)
    else:
        hosts.cut(victim)
    for _, process in drivers:
        process.wait(timeout=300)
    figure(f"fault {fault} of node {victim}: drivers done {time.monotonic() - started:.1f} s after it")

    lost, wrong, total, worst = [], [], 0, 0.0
    for i, (out_path, process) in enumerate(drivers):
        assert process.returncode == 0, (tmp_path / f"drive-{i}.log").read_text()[-3000:]
        result = json.loads(out_path.read_text())
        worst = max(worst, result["worst_step_s"])
        for goal, reward, _ in result["episodes"]:
            total += 1
            if isinstance(reward, str):
                lost.append((i, goal, reward))
            elif reward != pytest.approx(expert_plans[goal][1]):
                wrong.append((i, goal, reward, expert_plans[goal][1]))
    figure(f"3-node Ray Serve, {fault}: {total} episodes, {len(lost)} lost, worst step delay {worst:.2f} s")
    assert not lost, lost[:5]
    assert not wrong, wrong[:5]
    assert total >= SLOTS
    steps = [served_steps(nodes, i) for i in range(3)]
    figure(f"steps served per node (replica logs): {steps}")
    assert all(count > 0 for count in steps), steps
