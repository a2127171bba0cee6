"""``make venv-gpu VERL_LINE=...`` (deploy/slurm/venv-gpu.py): the GPU environment of a Slurm job without
containers has the trainer image's pins, and its install resolves; the sbatch's per-node check refuses an
environment without them, saying what to do.

The install itself (CUDA wheels, GBs) cannot run here: pip's resolver runs its steps against the package index
(``--dry-run --report``), with this interpreter; skipped where the index cannot be reached."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


venv_gpu = _load("venv_gpu", REPO / "deploy" / "slurm" / "venv-gpu.py")


@pytest.mark.parametrize("line, sglang, verl", [("0.9", "sglang==0.5.12", "verl==0.9.1"),
                                                ("0.7", "sglang==0.5.9", "verl==0.7.1")])  # fmt: skip
def test_the_steps_are_the_images(line: str, sglang: str, verl: str) -> None:
    steps = venv_gpu.image_steps(line)
    assert steps["sglang"] == sglang and steps["verl"] == verl
    assert "./services/env" in steps["install"] and "./services/trainer" in steps["install"]
    text = Path(steps["base"]).read_text()
    assert sglang in text and "torch==" in text  # the base image's documented pins: the CUDA torch with them
    assert venv_gpu.editable(["./services/env", verl]) == ["-e", "./services/env", verl]


def test_make_venv_gpu_runs_the_script() -> None:
    result = subprocess.run(
        ["make", "-n", "venv-gpu", "VERL_LINE=0.9"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "deploy/slurm/venv-gpu.py --line 0.9 --venv .venv-gpu-0.9" in result.stdout


def test_the_node_check_refuses_this_cpu_environment() -> None:
    """This venv has no sglang (and a CPU torch): the sbatch's per-node check fails with what to do."""
    result = subprocess.run([sys.executable, str(REPO / "deploy" / "slurm" / "gpu-check.py"), "--gpus", "8"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert "FAILED" in result.stderr and "make venv-gpu VERL_LINE=0.9" in result.stderr
    assert "AGENTRL_GPU_CHECK=0" in result.stderr


@pytest.fixture(scope="module")
def index_reachable() -> None:
    config = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                            capture_output=True, text=True)  # fmt: skip
    url = config.stdout.strip() or "https://pypi.org/simple/"
    try:
        urllib.request.urlopen(url.rstrip("/") + "/verl/", timeout=20).close()
    except OSError as error:
        pytest.skip(f"the package index ({url}) cannot be reached: {error}")


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("AGENTRL_TEST_VENV_GPU") != "1",
    reason="resolving sglang's whole tree takes 5-20 min on 2 cores, beyond CI's budget: make venv-gpu-check "
    "(or AGENTRL_TEST_VENV_GPU=1) runs it",
)
def test_the_verl09_gpu_environment_resolves_with_the_images_pins(
    index_reachable: None, tmp_path: Path
) -> None:
    resolved = {name.lower(): version for name, version in venv_gpu.dry_run("0.9", tmp_path).items()}
    base = {line.split("==")[0].lower(): line.split("==")[1] for line in
            (REPO / "docker" / "trainer-verl09-base-packages.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}  # fmt: skip
    assert resolved["sglang"] == "0.5.12" and resolved["verl"] == "0.9.1"
    assert resolved["torch"] == base["torch"]  # the image's CUDA torch, held by the lock
    assert resolved["transformers"] == "5.9.0"  # unlocked on purpose, as in the image (verl 0.9.1's own pin)
    assert "ray" in resolved and "transferqueue" in resolved
