"""`make up-ray` gives its head the machine's GPUs (verl refuses a cluster with 0 when a run wants 1) and
Ray's own object store size when it is meant for training; an env-only head stays small."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_envs.ray_serve import local


def _fake_nvidia_smi(tmp_path: Path, gpus: int) -> str:
    script = tmp_path / "nvidia-smi"
    lines = "\n".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'" for i in range(gpus))
    script.write_text(f"#!/bin/sh\n{lines}\n")
    script.chmod(0o755)
    return str(tmp_path)


def test_machine_gpus_counts_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, 4) + os.pathsep + os.environ["PATH"])
    assert local.machine_gpus() == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert local.machine_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local.machine_gpus() == 0


def test_no_nvidia_smi_means_no_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert local.machine_gpus() == 0


@pytest.mark.parametrize(("gpus", "store"), [(2, None), (0, local.OBJECT_STORE_BYTES)])
def test_up_passes_the_gpus_and_sizes_the_object_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int, store: int | None
) -> None:
    seen = {}

    def fake_up(run_dir, catalog, port, replicas, cpus, gpus, object_store_bytes):
        seen.update(gpus=gpus, store=object_store_bytes)
        return {"env": {"local_url": "http://127.0.0.1:1"}, "address": "127.0.0.1:2", "log": "x"}

    monkeypatch.setattr(local, "up", fake_up)
    monkeypatch.setattr(local, "machine_gpus", lambda: gpus)
    assert local.main(["up", "--run-dir", str(tmp_path)]) == 0
    assert seen == {"gpus": gpus, "store": store}


def test_the_head_command_carries_them(tmp_path: Path) -> None:
    training = local.LocalRayHead(tmp_path / "a", cpus=2, gpus=8, object_store_bytes=None)
    small = local.LocalRayHead(tmp_path / "b", cpus=2)
    assert "--num-gpus=8" in training.command()
    assert not any(part.startswith("--object-store-memory") for part in training.command())
    assert "--num-gpus=0" in small.command()
    assert f"--object-store-memory={local.OBJECT_STORE_BYTES}" in small.command()
