"""The shell scripts compose.yaml runs (catalog-init, trainer, eval), executed here as the containers would get
them after compose's interpolation: catalog-init against the real `agent-envs` CLI on a small generated
catalog, the trainer and eval scripts against recording stubs of `agent-train`, `nvidia-smi` and `python3`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from agent_trainer.config import load_training_config

REPO = Path(__file__).resolve().parents[2]

STUB = """#!/bin/sh
{ echo "--- $(basename "$0")"; for arg in "$@"; do printf '%s\\n' "$arg"; done
  env | grep -E '^(AGENTRL_|HF_TOKEN|WANDB_)' | sort | sed 's/^/@env /'; } >> "$STUB_LOG"
"""
NVIDIA_SMI_STUB = """#!/bin/sh
echo "GPU 0: NVIDIA H100 (UUID: GPU-0)"
echo "GPU 1: NVIDIA H100 (UUID: GPU-1)"
"""


def _script(rendered: dict, service: str) -> tuple[list[str], str]:
    spec = rendered["services"][service]
    (script,) = spec["command"]
    return spec["entrypoint"], script.replace("$$", "$")  # compose's escape for a literal $


def _environment(rendered: dict, service: str, **overrides: str) -> dict[str, str]:
    env = {k: ("" if v is None else str(v)) for k, v in rendered["services"][service]["environment"].items()}
    env.update(overrides)
    return env


def _run(
    entrypoint: list[str], script: str, env: dict[str, str], path: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*entrypoint, script], capture_output=True, text=True, env={**env, "PATH": path, "LANG": "C.UTF-8"},
        timeout=120,
    )  # fmt: skip


def _calls(log: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """(program, arguments, AGENTRL_*/HF_TOKEN/WANDB_* environment) of each stub call."""
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    for line in log.read_text().splitlines():
        if line.startswith("--- "):
            calls.append((line[4:], [], {}))
        elif line.startswith("@env "):
            name, _, value = line[5:].partition("=")
            calls[-1][2][name] = value
        else:
            calls[-1][1].append(line)
    return calls


@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, Any]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("agent-train", STUB), ("python3", STUB), ("nvidia-smi", NVIDIA_SMI_STUB)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return {"path": f"{bin_dir}:/usr/bin:/bin", "log": tmp_path / "calls.log", "root": tmp_path}


# ---- catalog-init ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def webshop_env_bin() -> Path:
    candidate = Path(sys.executable).parent / "agent-envs"
    if not candidate.exists():
        pytest.skip("agent-envs is not installed in this environment (make setup)")
    return candidate


def test_catalog_init_prepares_once_and_again_when_the_source_changes(
    rendered: dict, webshop_env_bin: Path, tmp_path: Path
) -> None:
    entrypoint, script = _script(rendered, "catalog-init")
    data = tmp_path / "data"
    data.mkdir()
    script = script.replace("/data", str(data))
    path = f"{webshop_env_bin.parent}:/usr/bin:/bin"
    env = _environment(rendered, "catalog-init", HOME=str(tmp_path), CATALOG_PRODUCTS="120", CATALOG_SEED="3")

    first = _run(entrypoint, script, env, path)
    assert first.returncode == 0, first.stderr
    assert "preparing" in first.stdout
    assert (data / "catalog" / "manifest.json").is_file()
    assert (
        data / "catalog.source"
    ).read_text().strip() == "source=generated products=120 seed=3 goal_sets=auto"

    again = _run(entrypoint, script, env, path)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout

    changed = _run(entrypoint, script, {**env, "CATALOG_SEED": "4"}, path)
    assert changed.returncode == 0, changed.stderr
    assert "preparing" in changed.stdout
    assert (data / "raw" / "generated-120-seed4").is_dir()
    assert "seed=4" in (data / "catalog.source").read_text()


def test_catalog_init_rejects_an_unknown_source(
    rendered: dict, webshop_env_bin: Path, tmp_path: Path
) -> None:
    entrypoint, script = _script(rendered, "catalog-init")
    script = script.replace("/data", str(tmp_path))
    env = _environment(rendered, "catalog-init", HOME=str(tmp_path), CATALOG_SOURCE="huge")
    result = _run(entrypoint, script, env, f"{webshop_env_bin.parent}:/usr/bin:/bin")
    assert result.returncode == 2
    assert "CATALOG_SOURCE must be generated, small or full" in result.stderr


def test_catalog_init_explains_an_unwritable_data_dir(rendered: dict, tmp_path: Path) -> None:
    entrypoint, script = _script(rendered, "catalog-init")
    data = tmp_path / "data"
    data.mkdir(mode=0o555)
    if (
        os.geteuid() == 0
    ):  # root writes anywhere: run the script as `nobody`, as a container with RUN_UID would
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and setpriv (util-linux) is missing")
        entrypoint = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *entrypoint]
    env = _environment(rendered, "catalog-init", HOME=str(tmp_path))
    result = _run(entrypoint, script.replace("/data", str(data)), env, "/usr/bin:/bin")
    assert result.returncode == 1
    assert "not writable" in result.stderr and "RUN_UID" in result.stderr


# ---- trainer -----------------------------------------------------------------------------------------------------
def _train(rendered: dict, stubs: dict[str, Any], **settings: str) -> subprocess.CompletedProcess[str]:
    entrypoint, script = _script(rendered, "trainer")
    script = script.replace("/outputs/", f"{stubs['root']}/outputs/")
    script = script.replace("configs=/opt/agentrl/configs", f"configs={REPO / 'configs'}")  # the image's copy
    env = _environment(
        rendered, "trainer", HOME=str(stubs["root"] / "home"), STUB_LOG=str(stubs["log"]),
        AGENTRL_CONFIG_DIR="/opt/agentrl/configs", **settings,
    )  # fmt: skip
    return _run(entrypoint, script, env, stubs["path"])


def test_trainer_runs_preflight_data_then_the_launcher(rendered: dict, stubs: dict[str, Any]) -> None:
    result = _train(
        rendered, stubs, AGENTRL_MODEL_PATH="Qwen/Qwen2.5-0.5B-Instruct", AGENTRL_TRAIN_BATCH_SIZE="16",
        TRAIN_EXTRA_ARGS="trainer.save_freq=5  trainer.test_freq=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    calls = _calls(stubs["log"])
    assert [(name, args[0]) for name, args, _ in calls] == [
        ("python3", "/opt/agentrl/trainer-image-check.py"), ("agent-train", "preflight"),
        ("agent-train", "data"), ("agent-train", "train"),
    ]  # fmt: skip
    run = stubs["root"] / "outputs" / "logs" / "webshop_grpo_test"
    ckpt = stubs["root"] / "outputs" / "checkpoints" / "webshop_grpo_test"
    (
        (_, imports, _),
        (_, preflight, preflight_env),
        (_, data, _),
        (_, train, train_env),
    ) = calls
    # the imports the image build deferred (they need the GPU driver) run first, with the driver required
    assert imports == [
        "/opt/agentrl/trainer-image-check.py",
        "--configs",
        str(REPO / "configs"),  # the image's /opt/agentrl/configs (_train points the job at this checkout's)
        "--require-driver",
    ]
    # the run's own overrides are preflighted (verl's struct checks and validate_config) before the GPU
    assert preflight == ["preflight", "--config", "webshop_grpo_test", "--env", "webshop", "--catalog", "/data/catalog",
                         "--env-url", "http://balancer:8080", "--out", f"{run}/preflight", "trainer.save_freq=5",
                         "trainer.test_freq=2"]  # fmt: skip
    # WebShop's rows by the same command as any environment's (a test config's first rows)
    assert data == ["data", "--env", "webshop", "--catalog", "/data/catalog", "--out-dir", f"{run}/data",
                    "--train-rows", "64", "--val-rows", "16", "--test-rows", "16"]  # fmt: skip
    assert train == [
        "train", "--config", "webshop_grpo_test", "--experiment", "webshop_grpo_test", "--output-dir",
        f"{stubs['root']}/outputs/logs", f"trainer.default_local_dir={ckpt}", "trainer.save_freq=5",
        "trainer.test_freq=2",
    ]  # fmt: skip
    for env in (preflight_env, train_env):
        assert env["AGENTRL_MODEL_PATH"] == "Qwen/Qwen2.5-0.5B-Instruct"
        assert env["AGENTRL_TRAIN_BATCH_SIZE"] == "16"
        assert env["AGENTRL_N_GPUS"] == "2", "counted with nvidia-smi -L when not set"
        assert env["AGENTRL_URL"] == "http://balancer:8080"
        # empty settings are unset, so that the configs' ${oc.env:NAME,default} defaults apply
        assert "AGENTRL_ROLLOUT_N" not in env and "AGENTRL_EXPERIMENT" not in env and "HF_TOKEN" not in env
    assert train_env["AGENTRL_TRAIN_FILE"] == f"{run}/data/train.parquet"
    assert train_env["AGENTRL_VAL_FILE"] == f"{run}/data/val.parquet"
    assert ckpt.is_dir() and (run / "data").is_dir()


def test_trainer_verl09_builds_agent_loop_rows_with_the_same_job(
    rendered: dict, stubs: dict[str, Any]
) -> None:
    """The 0.9 line's service runs the trainer's own job; its image's verl (0.9.1) makes `agent-train data` write
    agent-loop rows (the command picks the installed line's route), and VERL_LINE=0.9 its configs."""
    assert _script(rendered, "trainer-verl09") == _script(rendered, "trainer")
    service = rendered["services"]["trainer-verl09"]
    assert service["build"]["dockerfile"] == "docker/trainer-verl09.Dockerfile"
    assert service["image"] != rendered["services"]["trainer"]["image"]
    result = _train(rendered, stubs, VERL_LINE="0.9")
    assert result.returncode == 0, result.stderr
    (data,) = [args for name, args, _ in _calls(stubs["log"]) if args[0] == "data"]
    assert data[:3] == ["data", "--env", "webshop"] and "--interaction" not in data
    (imports,) = [args for name, args, _ in _calls(stubs["log"]) if name == "python3"]
    assert imports[1:] == ["--configs", str(REPO / "configs" / "verl09"), "--require-driver"]


def test_the_configs_knobs_reach_the_trainer(rendered: dict, stubs: dict[str, Any]) -> None:
    """Every AGENTRL_* knob the configs read with oc.env is passed by compose (empty: unset, config default)."""
    import re

    configs = Path(__file__).resolve().parents[2] / "configs"
    knobs = set()
    for config in configs.glob("*_grpo_*.yaml"):  # as composed: each environment's file and its base
        composed = load_training_config(config.stem, directory=configs, with_verl=False)
        knobs |= set(re.findall(r"oc\.env:(AGENTRL_\w+)", OmegaConf.to_yaml(composed)))
    # set by the job script itself (data files), by `agent-train train` (output dir, interaction config)
    knobs -= {
        "AGENTRL_TRAIN_FILE",
        "AGENTRL_VAL_FILE",
        "AGENTRL_OUTPUT_DIR",
        "AGENTRL_INTERACTION_CONFIG",
        "AGENTRL_AGENT_LOOP_CONFIG",
    }
    assert {
        "AGENTRL_SAVE_FREQ",
        "AGENTRL_TEST_FREQ",
        "AGENTRL_VAL_MAX_SAMPLES",
        "AGENTRL_ROLLOUT_ENGINE",
    } <= knobs
    assert knobs <= set(rendered["services"]["trainer"]["environment"])
    settings = {"AGENTRL_SAVE_FREQ": "3", "AGENTRL_TEST_FREQ": "2", "AGENTRL_VAL_MAX_SAMPLES": "8",
                "AGENTRL_ROLLOUT_ENGINE": "vllm"}  # fmt: skip
    result = _train(rendered, stubs, **settings)
    assert result.returncode == 0, result.stderr
    _, _, env = _calls(stubs["log"])[-1]
    assert {k: env[k] for k in settings} == settings


def test_gpu_jobs_work_in_a_directory_any_uid_can_write(rendered: dict) -> None:
    for service in ("trainer", "eval"):
        assert rendered["services"][service]["working_dir"] == "/outputs/logs"
        logs = next(v for v in rendered["services"][service]["volumes"] if v["target"] == "/outputs/logs")
        assert not logs.get("read_only")


def test_tensorboard_does_not_need_the_trainer_image(rendered: dict) -> None:
    tensorboard, trainer = rendered["services"]["tensorboard"], rendered["services"]["trainer"]
    assert tensorboard["image"] != trainer["image"]
    assert tensorboard["build"]["dockerfile"] == "docker/tensorboard.Dockerfile"


def test_trainer_full_config_and_explicit_settings(rendered: dict, stubs: dict[str, Any]) -> None:
    result = _train(rendered, stubs, TRAIN_CONFIG="full", AGENTRL_N_GPUS="4", AGENTRL_EXPERIMENT="run7",
                    AGENTRL_ROLLOUT_N="8")  # fmt: skip
    assert result.returncode == 0, result.stderr
    _, train, env = _calls(stubs["log"])[-1]
    # TRAIN_CONFIG=full: WebShop's old name of its full run, the config webshop_grpo_train
    assert train[:5] == ["train", "--config", "webshop_grpo_train", "--experiment", "run7"]
    assert train[-1].endswith("/outputs/checkpoints/run7")
    assert (env["AGENTRL_N_GPUS"], env["AGENTRL_EXPERIMENT"], env["AGENTRL_ROLLOUT_N"]) == ("4", "run7", "8")


@pytest.mark.parametrize(("line", "config", "envs"), [("0.7", "textcraft_grpo_test", "textcraft"),
                                                     ("0.9", "mixed_grpo_train", "textcraft,babyai,webshop")])  # fmt: skip
def test_trainer_builds_the_data_of_another_environment_or_a_mix(
    rendered: dict, stubs: dict[str, Any], line: str, config: str, envs: str
) -> None:
    """`make train-test ENV=textcraft` (TRAIN_CONFIG=textcraft_grpo_test, TRAIN_ENVS=textcraft): that config, its
    environments' train/val/test rows (the image's own route: the data command picks it from the installed verl)."""
    result = _train(rendered, stubs, TRAIN_CONFIG=config, TRAIN_ENVS=envs, VERL_LINE=line)
    assert result.returncode == 0, result.stderr
    calls = _calls(stubs["log"])
    assert [args[0] for name, args, _ in calls if name == "agent-train"] == ["preflight", "data", "train"]
    run = stubs["root"] / "outputs" / "logs" / config
    (data,) = [args for _, args, _ in calls if args[0] == "data"]
    # a test config reads its first rows only: those are built, not every task (SciWorld: a reset is a JVM's)
    limits = (
        ["--train-rows", "64", "--val-rows", "16", "--test-rows", "16"] if config.endswith("_test") else []
    )
    assert data == ["data", "--env", envs, "--catalog", "/data/catalog", "--out-dir", f"{run}/data", *limits]
    _, train, env = calls[-1]
    assert train[:5] == ["train", "--config", config, "--experiment", config]
    assert (env["AGENTRL_TRAIN_FILE"], env["AGENTRL_VAL_FILE"]) == (f"{run}/data/train.parquet",
                                                                    f"{run}/data/val.parquet")  # fmt: skip


@pytest.mark.parametrize(("settings", "limits"), [({"AGENTRL_TRAIN_MAX_SAMPLES": "8"}, ["--train-rows", "8", "--val-rows", "16", "--test-rows", "16"]),
                                                  ({"AGENTRL_TRAIN_MAX_SAMPLES": "-1"}, [])])  # fmt: skip
def test_a_test_configs_rows_follow_its_sample_limits(
    rendered: dict, stubs: dict[str, Any], settings: dict[str, str], limits: list[str]
) -> None:
    result = _train(rendered, stubs, TRAIN_CONFIG="sciworld_grpo_test", TRAIN_ENVS="sciworld", **settings)
    assert result.returncode == 0, result.stderr
    (data,) = [args for _, args, _ in _calls(stubs["log"]) if args[0] == "data"]
    assert data[7:] == limits


def test_trainer_rejects_an_unknown_config(rendered: dict, stubs: dict[str, Any]) -> None:
    result = _train(rendered, stubs, TRAIN_CONFIG="huge")
    assert result.returncode == 2
    assert "TRAIN_CONFIG must be <env>_grpo_test or <env>_grpo_train" in result.stderr
    assert not stubs["log"].exists()


def test_trainer_stops_when_preflight_fails(rendered: dict, stubs: dict[str, Any]) -> None:
    failing = stubs["root"] / "bin" / "agent-train"
    failing.write_text(STUB + 'if [ "$1" = preflight ]; then exit 1; fi\n')
    result = _train(rendered, stubs)
    assert result.returncode == 1
    assert [args[0] for _, args, _ in _calls(stubs["log"])] == [
        "/opt/agentrl/trainer-image-check.py",
        "preflight",
    ]


def test_trainer_stops_when_a_module_does_not_import_with_the_driver(
    rendered: dict, stubs: dict[str, Any]
) -> None:
    failing = stubs["root"] / "bin" / "python3"
    failing.write_text(STUB + "exit 1\n")
    result = _train(rendered, stubs)
    assert result.returncode == 1
    assert [args[0] for _, args, _ in _calls(stubs["log"])] == ["/opt/agentrl/trainer-image-check.py"]


# ---- eval ----------------------------------------------------------------------------------------------------------
def test_eval_needs_a_model_and_passes_the_settings(rendered: dict, stubs: dict[str, Any]) -> None:
    entrypoint, script = _script(rendered, "eval")
    script = script.replace("/outputs/", f"{stubs['root']}/outputs/")
    env = _environment(rendered, "eval", HOME=str(stubs["root"] / "home"), STUB_LOG=str(stubs["log"]))

    missing = _run(entrypoint, script, env, stubs["path"])
    assert missing.returncode == 2
    assert "set EVAL_MODEL_PATH" in missing.stderr

    settings = {"EVAL_MODEL_PATH": "/outputs/checkpoints/run7/hf", "EVAL_MAX_SAMPLES": "7",
                "EVAL_EXTRA_ARGS": "--concurrency 64"}  # fmt: skip
    result = _run(entrypoint, script, {**env, **settings}, stubs["path"])
    assert result.returncode == 0, result.stderr
    (imports, (name, args, _)) = _calls(stubs["log"])
    # the imports first (sglang's server among them), with the GPU driver required
    assert imports[:2] == ("python3", ["/opt/agentrl/trainer-image-check.py", "--configs", "/opt/agentrl/configs",
                                       "--require-driver"])  # fmt: skip
    assert name == "agent-train"
    assert args == [
        "eval", "--policy", "checkpoint", "--model-path", "/outputs/checkpoints/run7/hf", "--url",
        "http://balancer:8080", "--env", "webshop", "--catalog", "/data/catalog", "--split", "test", "--max-samples", "7",
        "--out", f"{stubs['root']}/outputs/logs/eval/run7-hf-webshop-test", "--concurrency", "64",
    ]  # fmt: skip

    # a training run's checkpoint directory: its latest step, named <experiment>-global_step_N; an evaluation of it
    # under the name WebShop's had before (<name>-<split>) is moved to the one every environment's has, and resumed
    experiment = stubs["root"] / "outputs" / "checkpoints" / "webshop_grpo_test"
    (experiment / "global_step_8" / "actor").mkdir(parents=True)
    (experiment / "latest_checkpointed_iteration.txt").write_text("8")
    eval_dir = stubs["root"] / "outputs" / "logs" / "eval"
    (eval_dir / "webshop_grpo_test-global_step_8-test").mkdir(parents=True)
    (eval_dir / "webshop_grpo_test-global_step_8-test" / "trajectories.jsonl").write_text("{}\n")
    stubs["log"].unlink()
    latest = _run(entrypoint, script, {**env, "EVAL_MODEL_PATH": f"{experiment}/"}, stubs["path"])
    assert latest.returncode == 0, latest.stderr
    (_, (_, args, _)) = _calls(stubs["log"])
    assert args[args.index("--model-path") + 1] == f"{experiment}/global_step_8"
    assert args[args.index("--out") + 1] == str(eval_dir / "webshop_grpo_test-global_step_8-webshop-test")
    assert (
        eval_dir / "webshop_grpo_test-global_step_8-webshop-test" / "trajectories.jsonl"
    ).read_text() == "{}\n"
    assert not (eval_dir / "webshop_grpo_test-global_step_8-test").exists()
    assert "eval: moved" in latest.stderr
