"""``deploy/slurm/agent-grpo.sbatch`` for environments other than WebShop, on a real two-node Slurm (``_slurm``:
network namespaces), as docs/multi-node.md shows it (``AGENTRL_TRAIN_ENVS``, ``AGENTRL_TRAIN_CONFIG``; issue 35).

- What cannot run is refused before Ray starts: SciWorld with two Serve replicas per node (the plan, exit 2), and
  SciWorld where the nodes' ``java`` (here ``$JAVA_HOME/bin/java``, as a cluster's JDK tarball would be given) is not
  Java 17 (every node's check, exit 3). Seconds of job time: ``make test-all``.
- TextCraft, BabyAI and SciWorld in one job (``AGENTRL_TRAIN_ENVS=textcraft,babyai,sciworld``; Java 17 given as
  ``JAVA_HOME``): the plan (the mixed test config), every node's check, the rows built by ``agent-train data``
  before Ray, the Serve app serving the three (no other), ``env-check`` playing each of them from both nodes
  through the node's own proxy, to the rewards the environments' own cores pay the same actions, and SciWorld's
  episodes never replayed (one replica per node keeps each node's episodes on the replica holding their JVMs);
  the training command is a stand-in that reads the rows the job built. Minutes (a JVM per SciWorld reset and
  expert path): ``make test-two-node``.
- TextCraft trained by verl's real trainer (``AGENTRL_TRAIN_ENVS=textcraft``): the rows built by the job, TextCraft
  served on both nodes, env-check, the batch sizes dry-run before Ray, then the training command (verl 0.7.1's
  ``agent-train train --config textcraft_grpo_test`` with the rehearsal's CPU seams: a tiny model, the CPU rollout
  engine, one declared GPU per node) trains 2 steps with an FSDP worker on each node, each node's proxy serving
  TextCraft steps during the training, and saves a checkpoint: ``make test-two-node`` (8 min 41 s at load
  average 9-10 on the shared 2-core machine; the mixed job above 3 min 55 s).

Needs root, ``ip`` and ``make slurm``; skips with the reason otherwise.
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from _raynodes import env_steps_served, figure, fsdp_worker_nodes, rehearsal_run_settings
from _slurm import SCRIPT, SERVE_PORT, SlurmCluster, job_env, slurm_fixture, submit_until_started

pytestmark = pytest.mark.timeout(3600)
TWO_NODE = pytest.mark.skipif(
    os.environ.get("AGENTRL_TEST_TWO_NODE_TRAIN") != "1",
    reason="minutes of JVMs, or verl's trainer, on two Slurm nodes of a 2-core machine: make test-two-node "
    "(AGENTRL_TEST_TWO_NODE_TRAIN=1)",
)
TRAIN_STARTS = "agent-grpo: training: + "

# 8 CPUs a node: Ray's logical CPUs for the training run's actors (as test_slurm_verl.py)
slurm_cluster = slurm_fixture(nodes=2, cpus=8)


def _java_home() -> Path | None:
    """This machine's Java 17 home (the directory above ``bin/java``), else None."""
    java = shutil.which("java")
    if java is None:
        return None
    line = subprocess.run([java, "-version"], capture_output=True, text=True).stderr.splitlines()[:1]
    return Path(java).resolve().parents[1] if line and '"17' in line[0] else None


def _env_check_report(output: str) -> dict:
    return next(json.loads(line) for line in output.splitlines() if line.startswith('{"ok"'))


def _expert_reward(env_id: str, task: int, catalog: Path) -> float:
    from agent_trainer.rehearsal.warm_start import expert_episode, expert_plan, make_core

    core = make_core(env_id, catalog)
    return expert_episode(env_id, task, expert_plan(env_id, task, core=core), core=core)[1]["env_reward"]


def test_sciworld_jobs_that_cannot_run_are_refused_before_ray(
    slurm_cluster: SlurmCluster, generated_catalog_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("scienceworld")
    # two Serve replicas per node: no episode affinity among them (the plan refuses; nothing else runs)
    job = slurm_cluster.submit(SCRIPT, extra_args=["--time=10"], env=job_env(
        generated_catalog_dir, AGENTRL_GPU_CHECK="0", AGENTRL_TRAIN_ENVS="sciworld",
        AGENTRL_RAY_REPLICAS_PER_NODE="2"))  # fmt: skip
    info = slurm_cluster.wait(job, timeout=300, poll=1.0)
    output = slurm_cluster.output(job)
    assert info["JobState"] == "FAILED" and info["ExitCode"].startswith("2:"), f"{info}\n{output[-4000:]}"
    assert "agent-grpo: refused: sciworld on the Ray Serve app needs one replica per node, not 2" in output
    assert "envs-check" not in output and "Ray runtime started" not in output
    figure(f"Slurm job {job} (SciWorld, 2 replicas per node): {info['JobState']} {info['ExitCode']} in "
           f"{info['RunTime']}")  # fmt: skip

    # Java 11 where a cluster's JDK would be (JAVA_HOME): every node says so, before Ray
    bin_dir = tmp_path / "jdk-11" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "java").write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    (bin_dir / "java").chmod(0o755)
    job = slurm_cluster.submit(SCRIPT, extra_args=["--time=10"], env=job_env(
        generated_catalog_dir, AGENTRL_GPU_CHECK="0", AGENTRL_TRAIN_ENVS="sciworld",
        JAVA_HOME=str(bin_dir.parent)))  # fmt: skip
    info = slurm_cluster.wait(job, timeout=300, poll=1.0)
    output = slurm_cluster.output(job)
    assert info["JobState"] == "FAILED" and info["ExitCode"].startswith("3:"), f"{info}\n{output[-4000:]}"
    for node in slurm_cluster.names:
        assert f"envs-check {node}: FAILED: sciworld: {bin_dir / 'java'} is Java 11" in output, output[-4000:]
    assert "a node cannot serve the run's environments (sciworld;" in output
    assert "Ray runtime started" not in output and "rows: +" not in output
    figure(f"Slurm job {job} (SciWorld, Java 11 in JAVA_HOME): {info['JobState']} {info['ExitCode']} in "
           f"{info['RunTime']}")  # fmt: skip


@TWO_NODE
def test_sbatch_builds_serves_and_checks_textcraft_babyai_and_sciworld(
    slurm_cluster: SlurmCluster, generated_catalog_dir: Path, tmp_path: Path
) -> None:
    from agent_trainer.config import installed_verl_line

    pytest.importorskip("scienceworld")
    java_home = _java_home()
    if java_home is None:
        pytest.skip("no Java 17 here (apt-get install openjdk-17-jre-headless)")
    data = tmp_path / "data"
    # the stand-in training command: what the job exported for it, and the rows there
    show = ("import os, pyarrow.parquet as pq; print('rows', {s: pq.read_table(os.environ[f'AGENTRL_{s}_FILE'])"
            ".column('data_source').to_pylist() for s in ('TRAIN', 'VAL')})")  # fmt: skip
    environment = job_env(
        generated_catalog_dir, AGENTRL_GPU_CHECK="0", AGENTRL_ENV_CHECK_EPISODES="1",
        AGENTRL_TRAIN_ENVS="textcraft,babyai,sciworld", JAVA_HOME=str(java_home), AGENTRL_BUILD_DATA="1",
        AGENTRL_DATA_DIR=str(data), AGENTRL_TRAIN_MAX_SAMPLES="6", AGENTRL_VAL_MAX_SAMPLES="1",
        AGENTRL_TRAIN_CMD=shlex.join(["python", "-c", show]), AGENTRL_RAY_ATTACH_TIMEOUT_S="300",
    )  # fmt: skip
    environment.pop("RAY_TEMP_DIR")
    job, _ = submit_until_started(slurm_cluster, SCRIPT, environment, lambda _job, out: "agent-train env-check" in out,
                                  1800, extra_args=["--time=60"])  # fmt: skip
    info = slurm_cluster.wait(job, timeout=2400, poll=2.0)
    output = slurm_cluster.output(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{output[-8000:]}"

    # the plan, every node's check, the rows: all before Ray
    assert "agent-grpo: train on textcraft,babyai,sciworld with the mixed_grpo_test config" in output
    for node in slurm_cluster.names:
        assert re.search(rf"envs-check {node} ok (\S+ )*textcraft babyai sciworld$", output, re.MULTILINE), (
            output
        )
    assert "agent-grpo: rows: + agent-train data --env textcraft,babyai,sciworld" in output
    assert output.index("rows: +") < output.index("Ray runtime started")
    rows = ast.literal_eval(re.search(r"^rows (\{.*\})$", output, re.MULTILINE).group(1))  # the stand-in's
    assert {s: sorted(Counter(r).items()) for s, r in rows.items()} == {
        "TRAIN": [("babyai", 2), ("sciworld", 2), ("textcraft", 2)],
        "VAL": [("babyai", 1), ("sciworld", 1), ("textcraft", 1)],
    }, rows
    assert (data / f"slurm-{installed_verl_line()}-textcraft+babyai+sciworld-test" / "test.parquet").is_file()

    check = _env_check_report(output)
    assert check["ok"] and check["envs"] == ["textcraft", "babyai", "sciworld"], check  # the run's: no other
    assert sorted(n["node_ip"] for n in check["nodes"]) == sorted(slurm_cluster.hosts.ips), check
    for node in check["nodes"]:
        for env_id, played in node["envs"].items():
            (episode,) = played["episodes"]
            assert episode["done"] and episode["url"] == f"http://127.0.0.1:{SERVE_PORT}", played
            if env_id == "sciworld":  # its score; its step rewards are the score's changes
                assert episode["score"] == 100, played
                # the replica's JVM pool (a Counter: a count never incremented is absent): no step replayed
                assert "spares" in played["simulators"], played
                assert played["simulators"].get("replays", 0) == 0, played
            else:
                assert episode["reward"] == pytest.approx(
                    _expert_reward(env_id, episode["task"], generated_catalog_dir)
                ), (env_id, episode)
    figure(f"Slurm job {job} (textcraft,babyai,sciworld): {info['JobState']} in {info['RunTime']}; env-check: "
           + "; ".join(f"{n['node_ip']} " + ", ".join(f"{e} {p['episodes'][0]['steps']} steps"
                                                     for e, p in n["envs"].items()) for n in check["nodes"]))  # fmt: skip


@TWO_NODE
def test_sbatch_trains_textcraft_with_verl_on_two_nodes(
    slurm_cluster: SlurmCluster, generated_catalog_dir: Path, tmp_path: Path
) -> None:
    from agent_trainer.config import installed_verl_line
    from agent_trainer.rehearsal import run as rehearsal
    from agent_trainer.tiny_model import build_tiny_model

    line = installed_verl_line()
    work = tmp_path / "work"
    work.mkdir()
    # random weights: the run is judged on what ran, not on learning
    model = build_tiny_model(tmp_path / "tiny_model", generated_catalog_dir)
    env, ray, scale = rehearsal_run_settings(line, work, 48, generated_catalog_dir, checks=False)
    run = work / "runs" / "slurm-textcraft"
    checkpoints = run / "checkpoints"
    # no data files: the job's rows (AGENTRL_TRAIN_FILE / AGENTRL_VAL_FILE); no nnodes / GPUs: the allocation's
    overrides = [*scale, *(rehearsal.WRAP_07 if line == "0.7" else ()), *ray,
                 "data.max_prompt_length=2048",  # TextCraft's longest first turns are ~1,400 tiny-tokenizer tokens
                 "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=2",
                 f"actor_rollout_ref.model.path={model}", f"trainer.default_local_dir={checkpoints}",
                 "trainer.total_training_steps=2"]  # fmt: skip
    train = ["agent-train", "train", "--config", "textcraft_grpo_test", "--experiment", "slurm-textcraft",
             "--output-dir", str(work / "runs"), *overrides]  # fmt: skip
    environment = job_env(
        generated_catalog_dir, **env, AGENTRL_GPU_CHECK="0", AGENTRL_N_GPUS="1", AGENTRL_ENV_CHECK_EPISODES="1",
        AGENTRL_TRAIN_ENVS="textcraft", AGENTRL_BUILD_DATA="1", AGENTRL_DATA_DIR=str(tmp_path / "data"),
        AGENTRL_TRAIN_MAX_SAMPLES="8", AGENTRL_VAL_MAX_SAMPLES="2", AGENTRL_TRAIN_CMD=shlex.join(train),
        PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0", AGENTRL_RAY_ATTACH_TIMEOUT_S="300",
    )  # fmt: skip
    shutil.rmtree(environment.pop("RAY_TEMP_DIR"), ignore_errors=True)  # one per job
    started: list[datetime.datetime] = []

    def training_started(job: str, output: str) -> bool:
        # env-check's report: TextCraft played from both nodes, or the test fails now, not after the training
        if '{"ok"' in output:
            check = _env_check_report(output)
            assert check["ok"] and "textcraft" in check["envs"], f"env-check: {check}"
        if TRAIN_STARTS in output and not started:
            started.append(datetime.datetime.now())
        return bool(started)

    job, temps = submit_until_started(slurm_cluster, SCRIPT, environment, training_started, 2400,
                                      extra_args=["--time=120"])  # fmt: skip
    info = slurm_cluster.wait(job, timeout=3000, poll=5.0)
    output = slurm_cluster.output(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{output[-8000:]}"

    rows_dir = tmp_path / "data" / f"slurm-{line}-textcraft-test"
    assert "agent-grpo: rows: + agent-train data --env textcraft" in output
    assert (rows_dir / "train.parquet").is_file()
    dry_run = output.index("agent-grpo: batch sizes on 2 node(s) x 1 GPU(s): + agent-train train")
    assert dry_run < output.index("Ray runtime started")  # checked before the cluster started
    check = _env_check_report(output)
    assert sorted(n["node_ip"] for n in check["nodes"]) == sorted(slurm_cluster.hosts.ips)
    assert all(n["envs"]["textcraft"]["episodes"][0]["reward"] == 1.0 for n in check["nodes"]), check
    steps = sorted({row["step"] for row in rehearsal._metrics(run / "metrics" / "metrics.jsonl")})
    assert steps == [1, 2], steps
    assert (checkpoints / "global_step_2").is_dir()
    assert "trainer.nnodes=2" in output
    temp = temps[-1].with_name(f"{temps[-1].name}-0")
    actors = fsdp_worker_nodes(temp)
    served = env_steps_served(temp, started[0], route="/textcraft/v1/step")
    ips = sorted(slurm_cluster.hosts.ips[:2])
    figure(f"Slurm job {job} (TextCraft, verl {line}): {info['JobState']} in {info['RunTime']}; steps {steps}; FSDP "
           f"worker processes per node {dict(actors)}; TextCraft steps served per node's proxy during training "
           f"{dict(served)}")  # fmt: skip
    assert sorted(actors) == ips, actors
    assert sorted(served) == ips and all(served[ip] > 0 for ip in ips), served
    for base in temps:
        for path in base.parent.glob(f"{base.name}*"):
            shutil.rmtree(path, ignore_errors=True)
