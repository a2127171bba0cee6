"""One GPU count (GPU_IDS), checked on the host before any build: the same rules as the preflight's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_trainer import gpu_plan

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
SCRIPT = REPO / "services" / "trainer" / "src" / "agent_trainer" / "gpu_plan.py"


ALL_CONFIGS = [
    (sub, path.stem) for sub in ("", "verl09") for path in sorted((CONFIGS / sub).glob("*_grpo_*.yaml"))
]


@pytest.mark.parametrize(("sub", "name"), ALL_CONFIGS, ids=[f"{s or '0.7'}/{n}" for s, n in ALL_CONFIGS])
def test_defaults_read_from_the_yaml_are_what_hydra_composes(
    sub: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's reading (the config's file and its base, no Hydra) gives each knob's default that Hydra's
    composition gives, for every config of both lines (the project's files only: verl's defaults set no knob)."""
    from agent_trainer.config import load_training_config

    for variable in gpu_plan.KNOBS.values():
        monkeypatch.delenv(variable, raising=False)
    composed = load_training_config(name, directory=CONFIGS / sub, with_verl=False, resolve=True)
    defaults = gpu_plan.config_defaults(CONFIGS / sub / f"{name}.yaml")
    rollout = composed.actor_rollout_ref.rollout
    assert defaults == {
        "AGENTRL_N_GPUS": composed.trainer.n_gpus_per_node,
        "AGENTRL_ROLLOUT_TP": rollout.tensor_model_parallel_size,
        "AGENTRL_TRAIN_BATCH_SIZE": composed.data.train_batch_size,
        "AGENTRL_ROLLOUT_N": rollout.n,
    }


def test_the_files_read_are_the_config_and_the_bases_its_defaults_list_names(tmp_path: Path) -> None:
    """A knob the environment's file sets wins over its base's; a base of a base is read; verl's ppo_trainer (not
    in the config directory) is skipped; a default listed after _self_ wins over the file."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "outer.yaml").write_text(
        "defaults:\n  - /ppo_trainer\n  - inner\n  - _self_\nn: ${oc.env:AGENTRL_ROLLOUT_N,3}\n"
    )
    (tmp_path / "base" / "inner.yaml").write_text(
        "a: ${oc.env:AGENTRL_N_GPUS,2}\nn: ${oc.env:AGENTRL_ROLLOUT_N,5}\n"
    )
    (tmp_path / "x_grpo_test.yaml").write_text(
        "defaults:\n  - base/outer\n  - _self_\n"
        "b: ${oc.env:AGENTRL_TRAIN_BATCH_SIZE,8}\ntp: ${oc.env:AGENTRL_ROLLOUT_TP,1}\n"
    )
    files = gpu_plan.config_files(tmp_path / "x_grpo_test.yaml")
    assert [p.relative_to(tmp_path).as_posix() for p in files] == [
        "x_grpo_test.yaml",
        "base/outer.yaml",
        "base/inner.yaml",
    ]
    assert gpu_plan.config_defaults(tmp_path / "x_grpo_test.yaml") == {
        "AGENTRL_TRAIN_BATCH_SIZE": 8,
        "AGENTRL_ROLLOUT_TP": 1,
        "AGENTRL_ROLLOUT_N": 3,
        "AGENTRL_N_GPUS": 2,
    }
    (tmp_path / "y_grpo_test.yaml").write_text(
        "defaults:\n  - _self_\n  - base/inner\nn: ${oc.env:AGENTRL_ROLLOUT_N,9}\n"
    )
    assert [p.name for p in gpu_plan.config_files(tmp_path / "y_grpo_test.yaml")] == [
        "inner.yaml",
        "y_grpo_test.yaml",
    ]


def test_env_example_defaults_run_the_test_config_and_say_what_the_full_one_needs() -> None:
    settings = gpu_plan.read_env_file(REPO / ".env.example")
    assert gpu_plan.plan_errors("test", settings, CONFIGS) == (1, [])
    count, errors = gpu_plan.plan_errors("full", settings, CONFIGS)
    assert count == 1 and any("tensor parallel size 2" in e for e in errors)
    assert any("GPU_IDS=0,1,2,3" in e for e in errors)
    assert gpu_plan.plan_errors("full", {**settings, "GPU_IDS": "0,1,2,3"}, CONFIGS, visible=4) == (4, [])


@pytest.mark.parametrize(
    ("settings", "visible", "message"),
    [
        ({"GPU_IDS": "0,1", "AGENTRL_N_GPUS": "4"}, None, "AGENTRL_N_GPUS=4 but GPU_IDS=0,1"),
        ({"GPU_IDS": "0,1,2"}, None, "is not divisible by the 3 GPU(s)"),
        ({"GPU_IDS": "0,7"}, 2, "names device(s) 7, but nvidia-smi lists 2"),
        ({"GPU_IDS": "0,0"}, None, "lists a device twice"),
        ({"GPU_IDS": "all"}, None, "comma-separated device numbers"),
        ({"GPU_IDS": "0", "AGENTRL_ROLLOUT_TP": "2"}, None, "tensor parallel size 2"),
    ],
)
def test_mismatches_are_refused(settings: dict, visible: int | None, message: str) -> None:
    _, errors = gpu_plan.plan_errors("test", settings, CONFIGS, visible)
    assert any(message in e for e in errors), errors


def test_runs_with_the_hosts_python_alone(tmp_path: Path) -> None:
    """`make train-full` runs it with the system python3, before any venv or image exists."""
    env_file = tmp_path / ".env"
    env_file.write_text("GPU_IDS=0\n")
    clean = {"PATH": os.environ["PATH"]}
    ok = subprocess.run([sys.executable, "-S", str(SCRIPT), "--config", "test", "--env-file", str(env_file)],
                        capture_output=True, text=True, env=clean)  # fmt: skip
    assert (ok.returncode, ok.stdout.strip()) == (0, "1")
    refused = subprocess.run([sys.executable, "-S", str(SCRIPT), "--config", "full", "--env-file", str(env_file)],
                             capture_output=True, text=True, env=clean)  # fmt: skip
    assert refused.returncode == 2 and "GPU_IDS=0,1,2,3" in refused.stderr


def test_requires_python_stops_where_the_pinned_numpy_has_no_wheels() -> None:
    """constraints.txt pins numpy 1.26.4 (verl 0.7.1 needs numpy<2): it has wheels up to CPython 3.12."""
    import re

    assert "numpy==1.26.4" in (REPO / "constraints.txt").read_text()
    for package in ("env", "trainer"):
        text = (REPO / "services" / package / "pyproject.toml").read_text()
        assert re.search(r'^requires-python = ">=3\.10,<3\.13"', text, re.MULTILINE), package
