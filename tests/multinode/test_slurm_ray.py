"""``deploy/slurm/agent-grpo.sbatch`` on a real Slurm cluster (slurmctld, and two slurmd nodes, each in a
network namespace of its own): Ray head and worker started by the script with ``srun``, the env deployed
as a Ray Serve app serving WebShop and TextCraft (``AGENTRL_ENVS``), ``agent-train env-check`` from both nodes
playing both, and the training command replaced by a CPU stand-in: the preflight (configs, data, verl's
agent-loop worker on CPU) against the first node's Serve proxy. No Docker, no nginx, no root needed by the script.
The job ends COMPLETED (``scontrol show job``), the env served expert episodes of both environments on both
nodes, each through its own node's proxy, with the rewards the experts' actions earn in-process.

Needs root, ``ip`` and ``make slurm``; skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from _raynodes import figure
from _slurm import SlurmCluster, slurm_fixture

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "agent-grpo.sbatch"
EPISODES = 4  # per node
SERVE_PORT = 8000

slurm_cluster = slurm_fixture(nodes=2)


def test_sbatch_runs_ray_the_env_and_the_training_stand_in(
    slurm_cluster: SlurmCluster, generated_catalog_dir: Path, tmp_path: Path
) -> None:
    from agent_trainer.rehearsal.warm_start import expert_episode, expert_plan, make_core

    ray_temp = tempfile.mkdtemp(prefix="wsslr-", dir="/tmp")  # short: Ray's unix sockets live under it
    preflight_out = tmp_path / "preflight"
    env = {
        "AGENTRL_HOME": str(REPO),
        "AGENTRL_VENV": str(Path(sys.executable).parent.parent),
        "WEBSHOP_CATALOG": str(generated_catalog_dir),
        "AGENTRL_RAY_PORT": str(SERVE_PORT),
        "AGENTRL_ENV_CHECK_EPISODES": str(EPISODES),
        "AGENTRL_ENVS": "webshop,textcraft",  # served beside WebShop, and played by env-check
        "AGENTRL_GPU_CHECK": "0",  # the CPU stand-in (test_slurm_preemption.py: a job without GPUs fails at once)
        "RAY_TEMP_DIR": ray_temp,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_memory_monitor_refresh_ms": "0",
        "AGENTRL_TRAIN_CMD": f"agent-train preflight --config test --catalog {generated_catalog_dir} "
        f"--env-url http://127.0.0.1:{SERVE_PORT} --out {preflight_out}",
    }
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AGENTRL_", "WEBSHOP_"))},
        **env,
    }
    job = slurm_cluster.submit(SCRIPT, env=env, extra_args=["--time=15"])
    info = slurm_cluster.wait(job, timeout=780, poll=2.0)
    output = slurm_cluster.output(job)
    assert info["JobState"] == "COMPLETED", f"{output[-6000:]}\n{slurm_cluster.diagnostics(job)}"
    assert info["ExitCode"] == "0:0", output[-4000:]

    check = next(json.loads(line) for line in output.splitlines() if line.startswith('{"ok"'))
    assert check["ok"] and check["envs"] == ["webshop", "textcraft"], check
    served = {node["node_ip"]: node for node in check["nodes"]}
    assert sorted(served) == sorted(slurm_cluster.hosts.ips), check
    cores = {e: make_core(e, generated_catalog_dir) for e in check["envs"]}
    for node in served.values():
        assert node["env"] == "ray"  # the run's AGENTRL_ENV reached the node's workers
        for env_id, played in node["envs"].items():
            assert played["urls"][0] == f"http://127.0.0.1:{SERVE_PORT}"
            assert len(played["episodes"]) == EPISODES
            for episode in played["episodes"]:
                assert episode["url"] == f"http://127.0.0.1:{SERVE_PORT}"  # its own node's proxy served it
                core, task = cores[env_id], episode["task"]
                plan = expert_plan(env_id, task, core=core)
                assert episode["done"] and episode["reward"] == pytest.approx(
                    expert_episode(env_id, task, plan, core=core)[1]["env_reward"]
                ), (env_id, episode)

    summary = json.loads((preflight_out / "verl0.7" / "webshop" / "summary.json").read_text())
    assert summary["errors"] == [], summary["errors"]
    assert "agent-grpo: training command exited with 0" in output
    figure(
        f"Slurm job {job}: {info['JobState']} on {info['NodeList']} in {info['RunTime']}; env-check: "
        + ", ".join(
            f"{ip} {sum(len(p['episodes']) for p in node['envs'].values())} episodes of "
            f"{'+'.join(node['envs'])} via its own proxy"
            for ip, node in served.items()
        )
    )
