"""`make pin-digests` writes registry digests into the base-image ARG defaults, and nothing on a bad answer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docker" / "pin-digests.py"
DIGEST = "sha256:" + "ab" * 32


def fake_docker(tmp_path: Path, answer: str) -> Path:
    """A `docker` that answers `buildx imagetools inspect` with ``answer`` and records what it was asked."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    binary = tmp_path / "bin" / "docker"
    binary.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\necho '{answer}'\n")
    binary.chmod(0o755)
    return binary


def run(docker: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--docker", str(docker), *map(str, files)],
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"]})  # fmt: skip


def test_every_dockerfile_base_is_pinned_from_the_registry_answer(tmp_path: Path) -> None:
    copies = []
    for source in [REPO / "docker" / "trainer.Dockerfile", REPO / "docker" / "tensorboard.Dockerfile",
                   REPO / "docker" / "balancer" / "Dockerfile"]:  # fmt: skip
        copy = tmp_path / source.parent.name / source.name
        copy.parent.mkdir(exist_ok=True)
        shutil.copy(source, copy)
        copies.append(copy)
    docker = fake_docker(tmp_path, f'"{DIGEST}"')
    result = run(docker, *copies)
    assert result.returncode == 0, result.stderr
    assert f"ARG TRAINER_BASE_IMAGE=lmsysorg/sglang:v0.5.9@{DIGEST}\n" in copies[0].read_text()
    assert f"ARG PYTHON_BASE_IMAGE=python:3.11.13-slim-bookworm@{DIGEST}\n" in copies[1].read_text()
    assert f"@{DIGEST}\n" in copies[2].read_text()
    calls = (tmp_path / "calls").read_text()
    assert "buildx imagetools inspect lmsysorg/sglang:v0.5.9 --format" in calls
    again = run(docker, *copies)  # the digest replaces itself: idempotent, and the tag is what is asked for
    assert again.returncode == 0 and "already pinned" in again.stdout
    assert calls.count("lmsysorg/sglang:v0.5.9@") == 0


def test_a_bad_registry_answer_writes_nothing(tmp_path: Path) -> None:
    copy = tmp_path / "trainer.Dockerfile"
    shutil.copy(REPO / "docker" / "trainer.Dockerfile", copy)
    before = copy.read_text()
    result = run(fake_docker(tmp_path, '"<DIGEST>"'), copy)
    assert result.returncode == 1 and "not a sha256 digest" in result.stderr
    assert copy.read_text() == before
