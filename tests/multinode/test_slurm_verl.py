"""``deploy/slurm/agent-grpo.sbatch`` running verl's real trainer on both nodes of a real two-node Slurm
(``_slurm``: network namespaces), requeued after a checkpoint and resumed from it (issue 29).

The script does everything itself: the Ray head and worker by ``srun``, ``serve-ray``, ``env-check``, then its
training command with ``AGENTRL_ENV=ray`` and ``trainer.nnodes`` from the allocation (``AGENTRL_NNODES``). The
command is the rehearsal's training run (``agent_trainer.rehearsal``: its tiny model, CPU rollout engine and CPU
seams, prepared as ``test_verl_two_nodes.py`` prepares them) launched by ``agent-train train``, with 1 declared
GPU per node (``AGENTRL_N_GPUS=1``), so the actor's two FSDP workers, one per node, train together over gloo.
3 steps of 4 prompts, a checkpoint after every step. Once step 1's checkpoint is complete, ``scontrol requeue``:
SIGTERM stops the training, Slurm requeues the job, the second run starts Ray, the env and the check again on
both nodes, and verl's own resume (``resume_mode: auto``, through the launcher's check) continues from the
latest complete checkpoint to step 3: COMPLETED after 1 restart.

With the warm model cached the test took 14 minutes at load average 4-16 (19 at 12-30) on the shared 2-core
development machine (two Ray clusters and two verl starts). A cold cache adds the tiny model's warm start (1,500 supervised
steps, ~17 minutes at load 15-26 as the rehearsal measured it), so the warm model is kept in ``MODEL_CACHE``
between runs, first copied from ``make rehearse``'s ``outputs/rehearsal/tiny_model`` when that exists (the same
recipe: the bundled catalog, 12 goals); where the recipe differs the cache is retrained in place, never the
rehearsal's own model. A raylet gets 30 s to register (Ray's own bound), which a saturated machine can miss:
a job that fails so before its training starts is submitted again, a requeued run that does is requeued again
(``START_TRIES``).

Needs root, ``ip`` and ``make slurm``; skips with the reason otherwise. Runs with ``make test-two-node``
(AGENTRL_TEST_TWO_NODE_TRAIN=1), not in ``make test-all``.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import shutil
import time
from pathlib import Path

import pytest
from _raynodes import env_steps_served, figure, fsdp_worker_nodes, rehearsal_run_settings
from _slurm import (
    REPO,
    SCRIPT,
    TERMINAL,
    SlurmCluster,
    job_env,
    slurm_fixture,
    submit_until_started,
    wait_for,
)

pytestmark = [
    pytest.mark.timeout(5400),
    pytest.mark.skipif(
        os.environ.get("AGENTRL_TEST_TWO_NODE_TRAIN") != "1",
        reason="verl's trainer in a requeued two-node Slurm job takes ~20 min on 2 cores (a cold model: ~17 more): "
        "make test-two-node (AGENTRL_TEST_TWO_NODE_TRAIN=1)",
    ),
]
STEPS = 3  # 12 goals, 4 prompts a step: one epoch
#: The warm-started tiny model, kept between runs (outside the test's temporary directory).
MODEL_CACHE = Path("/tmp/webshop-test-cache/tiny_model")
TRAIN_STARTS = "agent-grpo: training: + "
#: Jobs submitted until one starts its training: a raylet gets 30 s to register (Ray's own bound), which a
#: saturated machine can miss (then the job fails before training, and a new one starts clean)
START_TRIES = 4

# 8 CPUs a node: Ray's logical CPUs for the run's actors (the rehearsal's ray_init.num_cpus=16 over two nodes)
slurm_cluster = slurm_fixture(nodes=2, cpus=8)


def _warm_model_dir() -> Path:
    """``MODEL_CACHE``, seeded from the rehearsal's warm model when the cache has none (copied whole, then
    renamed: a half-copied model is never used). The rehearsal's own folder is only read."""
    from agent_trainer.rehearsal.warm_start import MARKER

    rehearsal_model = REPO / "outputs" / "rehearsal" / "tiny_model-webshop"
    if not (MODEL_CACHE / MARKER).exists() and (rehearsal_model / MARKER).exists():
        partial = MODEL_CACHE.with_name(f"{MODEL_CACHE.name}.{os.getpid()}")
        shutil.copytree(rehearsal_model, partial)
        shutil.rmtree(MODEL_CACHE, ignore_errors=True)
        os.replace(partial, MODEL_CACHE)
    MODEL_CACHE.parent.mkdir(parents=True, exist_ok=True)
    return MODEL_CACHE


def test_sbatch_trains_verl_on_two_nodes_and_a_requeued_job_resumes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    from agent_trainer.config import installed_verl_line
    from agent_trainer.rehearsal import run as rehearsal

    line = installed_verl_line()
    work = tmp_path / "work"
    work.mkdir()
    # the bundled catalog (as make rehearse) and its 12 goals: the rehearsal's warm model fits them
    options = rehearsal.RehearsalOptions(
        out_dir=tmp_path / "rehearsal", goals=12, model_dir=_warm_model_dir()
    )
    started = time.monotonic()
    prepared = rehearsal._prepare(options, work, line)
    prepare_s = time.monotonic() - started

    env, ray, scale = rehearsal_run_settings(line, work, options.turn_tokens, prepared["catalog"])
    run = work / "runs" / rehearsal.EXPERIMENT
    checkpoints = run / "checkpoints"
    # no trainer.nnodes / n_gpus_per_node: the job's AGENTRL_NNODES and AGENTRL_N_GPUS give them
    overrides = [*scale, *(rehearsal.WRAP_07 if line == "0.7" else ()), *ray,
                 "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=1",
                 f"actor_rollout_ref.model.path={prepared['model']}", f"data.train_files={prepared['train']}",
                 f"data.val_files={prepared['val']}", f"data.train_max_samples={options.goals}",
                 f"trainer.default_local_dir={checkpoints}", f"trainer.total_training_steps={STEPS}"]  # fmt: skip
    train = ["agent-train", "train", "--config", rehearsal.training_config(line, ("webshop",)),
             "--experiment", rehearsal.EXPERIMENT, "--output-dir", str(work / "runs"), *overrides]  # fmt: skip
    environment = job_env(
        prepared["catalog"], **env, AGENTRL_GPU_CHECK="0", AGENTRL_N_GPUS="1", AGENTRL_ENV_CHECK_EPISODES="1",
        AGENTRL_TRAIN_CMD=shlex.join(train), PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0",
        AGENTRL_RAY_ATTACH_TIMEOUT_S="300",  # a GCS on a saturated machine answers late
    )  # fmt: skip
    shutil.rmtree(environment.pop("RAY_TEMP_DIR"), ignore_errors=True)  # one per job, below
    job = ""
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    training_from: dict[int, datetime.datetime] = {}  # run -> when the test saw its training command start

    def saved() -> int:
        try:
            return int(tracker.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def note_training(output: str) -> bool:
        """Note when the test saw each run's training command start; True once the first one has."""
        for run_index in range(output.count(TRAIN_STARTS)):
            training_from.setdefault(run_index, datetime.datetime.now())
        return bool(training_from)

    def watch(predicate):
        """``predicate``, noting when each run's training command starts; a job that ended fails at once."""

        def check() -> bool:
            output = slurm_cluster.output(job)
            note_training(output)
            if predicate():
                return True
            state = slurm_cluster.job(job).get("JobState")
            assert state not in TERMINAL - {"PREEMPTED"}, f"job {job} ended {state}\n{output[-6000:]}"
            return False

        return check

    ray_missed = (rehearsal.RAY_START_TIMEOUT, "did not attach within")

    job, ray_temps = submit_until_started(slurm_cluster, SCRIPT, environment, lambda _job, out: note_training(out),
                                          1800, START_TRIES, extra_args=["--time=180"])  # fmt: skip
    ray_temp = ray_temps[-1]
    wait_for(watch(lambda: saved() >= 1), 3000, "verl's checkpoint of step 1", slurm_cluster, job)
    requeues = 0

    def requeue() -> None:
        nonlocal requeues
        result = slurm_cluster.run(["scontrol", "requeue", job])
        assert result.returncode == 0, result.stderr  # the job is requeueable (#SBATCH --requeue)
        requeues += 1

    def resumed_training() -> bool:
        """The requeued run's training started; a run a Ray node failed to join (Ray's start-up bound, above) is
        requeued once more: it trained nothing, and the next run resumes from the same checkpoint."""
        output = slurm_cluster.output(job)
        if f"run {requeues} of job" not in output:
            return False
        this_run = output.rpartition(f"run {requeues} of job")[2]
        if TRAIN_STARTS not in this_run and any(m in this_run for m in ray_missed) and requeues < START_TRIES:
            figure(f"Slurm job {job}: run {requeues} lost a Ray node to Ray's start-up bound; requeued again")
            requeue()
            return False
        return len(training_from) >= 2

    requeue()
    wait_for(watch(lambda: "run 1 of job" in slurm_cluster.output(job)), 600, "the requeued run",
              slurm_cluster, job)  # fmt: skip
    # read before the second run's trainer starts (minutes away): the first run's latest complete checkpoint
    last_saved = saved()
    wait_for(watch(resumed_training), 2400, "the requeued run's training", slurm_cluster, job)
    info = slurm_cluster.wait(job, timeout=3000, poll=5.0)
    output = slurm_cluster.output(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{output[-8000:]}"
    assert int(info.get("Restarts", "0")) == requeues, info

    first = output.partition("run 1 of job")[0]
    second = output.rpartition(f"run {requeues} of job")[2]  # the run that resumed
    assert "agent-grpo: SIGTERM: stopping the training (run 0" in first, first[-3000:]
    assert 1 <= last_saved < STEPS, last_saved
    resumed = re.search(r"Load from checkpoint folder: \S*global_step_(\d+)", second)
    assert resumed and int(resumed.group(1)) == last_saved, second[-6000:]  # verl's own resume, from there
    metrics = run / "metrics"
    this_run = sorted({row["step"] for row in rehearsal._metrics(metrics / "metrics.jsonl")})
    assert this_run == list(range(last_saved + 1, STEPS + 1)), this_run  # the steps after it, trained
    assert (checkpoints / f"global_step_{STEPS}").is_dir() and saved() == STEPS
    assert second.count("Ray runtime started") >= 1 and "agent-train env-check" in second

    ips = sorted(slurm_cluster.hosts.ips[:2])
    for training, run_index in enumerate((0, requeues)):
        temp = ray_temp.with_name(f"{ray_temp.name}-{run_index}")
        actors = fsdp_worker_nodes(temp)
        served = env_steps_served(temp, training_from[training])
        figure(f"Slurm+verl run {run_index}: FSDP worker processes per node {dict(actors)}; env steps served "
               f"per node's proxy during training {dict(served)}")  # fmt: skip
        assert sorted(actors) == ips, actors
        assert sorted(served) == ips and all(served[ip] > 0 for ip in ips), served
    assert "trainer.nnodes=2" in output  # the launcher's, from the allocation
    figure(f"Slurm job {job}: verl {line} on 2 nodes, requeued after step {last_saved} was saved, resumed "
           f"there, steps {this_run} trained, {info['JobState']} after {info['Restarts']} restart in "
           f"{info['RunTime']} (this run); preparation {prepare_s:.0f} s")  # fmt: skip
    for temp in (t for base in ray_temps for t in base.parent.glob(f"{base.name}*")):  # kept when it fails
        shutil.rmtree(temp, ignore_errors=True)
