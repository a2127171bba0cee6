"""``deploy/slurm/agent-grpo.sbatch`` on a real two-node Slurm cluster (network namespaces, ``_slurm``): what a GPU
job checks before anything starts, and what a preempted or requeued job does.

- Without a GPU environment (this CPU venv: no sglang, a CPU torch) the job fails within seconds of starting,
  before Ray, naming what to do.
- ``scontrol requeue`` of a running job (what preemption with PreemptMode=REQUEUE does): SIGTERM stops the
  training, Slurm requeues the job, the second run starts Ray and the env again on both nodes and the training
  resumes from its latest complete checkpoint, then the job completes. The training is a stand-in
  (``_standin_train.py``: verl's checkpoint layout and order, the launcher's repair and verl's own
  ``find_latest_ckpt_path`` on resume); a real verl trainer across two Slurm nodes does not fit this 2-core machine
  twice over.

Needs root, ``ip`` and ``make slurm``; skips with the reason otherwise. The requeue takes ~5 minutes on 2 cores
(Ray and the env started twice on both nodes): it runs with ``make test-two-node`` (AGENTRL_TEST_TWO_NODE_TRAIN=1),
not in ``make test-all`` (CI's 60 minutes).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from _raynodes import figure
from _slurm import SCRIPT, SlurmCluster, job_env, slurm_fixture, wait_for

pytestmark = pytest.mark.timeout(1200)

STANDIN = Path(__file__).with_name("_standin_train.py")

slurm_cluster = slurm_fixture(nodes=2)


def test_a_job_without_the_gpu_environment_fails_before_ray(slurm_cluster: SlurmCluster,
                                                            generated_catalog_dir: Path) -> None:  # fmt: skip
    job = slurm_cluster.submit(SCRIPT, env=job_env(generated_catalog_dir), extra_args=["--time=10"])
    info = slurm_cluster.wait(job, timeout=300, poll=1.0)
    output = slurm_cluster.output(job)
    assert info["JobState"] == "FAILED" and info["ExitCode"].startswith("3:"), f"{info}\n{output[-4000:]}"
    assert "gpu-check" in output and "FAILED" in output, output[-4000:]
    assert "make venv-gpu VERL_LINE=0.9" in output and "Apptainer" in output
    assert "the GPU environment check failed on a node" in output
    assert "Ray runtime started" not in output and "serve-ray" not in output  # nothing was started
    figure(
        f"Slurm job {job} without a GPU environment: {info['JobState']} {info['ExitCode']} in {info['RunTime']}"
    )


@pytest.mark.skipif(
    os.environ.get("AGENTRL_TEST_TWO_NODE_TRAIN") != "1",
    reason="a requeued Slurm job takes ~5 min on 2 cores: make test-two-node (AGENTRL_TEST_TWO_NODE_TRAIN=1)",
)
def test_a_requeued_job_resumes_from_its_latest_complete_checkpoint(
    slurm_cluster: SlurmCluster, generated_catalog_dir: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    steps = 8
    train = f"{sys.executable} {STANDIN} --checkpoints {checkpoints} --steps {steps} --step-s 2"
    env = job_env(generated_catalog_dir, AGENTRL_GPU_CHECK="0", AGENTRL_ENV_CHECK_EPISODES="1",
                   AGENTRL_TRAIN_CMD=train)  # fmt: skip
    job = slurm_cluster.submit(SCRIPT, env=env, extra_args=["--time=60"])
    tracker = checkpoints / "latest_checkpointed_iteration.txt"

    def saved() -> int:
        try:
            return int(tracker.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    wait_for(lambda: saved() >= 2, 600, "a checkpoint of step 2", slurm_cluster, job)
    requeue = slurm_cluster.run(["scontrol", "requeue", job])
    assert requeue.returncode == 0, requeue.stderr  # the job is requeueable (#SBATCH --requeue)
    wait_for(lambda: "standin: resumed from step" in slurm_cluster.output(job), 600, "the requeued run", slurm_cluster,
              job)  # fmt: skip
    info = slurm_cluster.wait(job, timeout=600, poll=2.0)
    output = slurm_cluster.output(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{output[-6000:]}"
    assert int(info.get("Restarts", "0")) == 1, info

    first, _, second = output.partition("run 1 of job")
    assert second, output[-4000:]
    assert "agent-grpo: SIGTERM: stopping the training (run 0" in first, first[-3000:]
    last_saved = max(int(s) for s in re.findall(r"standin: step (\d+) saved", first))
    resumed = int(re.search(r"standin: resumed from step (\d+)", second).group(1))
    assert resumed == last_saved  # the latest complete checkpoint, not a half-written one after it
    trained_again = [int(s) for s in re.findall(r"standin: step (\d+) trained", second)]
    assert trained_again == list(range(resumed + 1, steps + 1))
    assert f"standin: done at step {steps}" in second
    assert second.count("Ray runtime started") >= 1 and "agent-train env-check" in second
    figure(f"Slurm job {job}: requeued after step {last_saved} was saved, resumed there, {info['JobState']} "
           f"after {info['Restarts']} restart in {info['RunTime']} (this run)")  # fmt: skip
