"""What ``make eval MODEL_PATH=...`` accepts, and how it becomes something sglang can serve.

Three forms:
- a Hugging Face hub id (``Qwen/Qwen2.5-1.5B-Instruct``): served as is, sglang downloads it (into HF_HOME);
- a Hugging Face model directory (``config.json`` and ``*.safetensors``/``*.bin``): served as is;
- a verl checkpoint: ``<experiment>/global_step_N`` (or its ``actor/`` folder), or the experiment directory
  itself (its latest step, from verl's ``latest_checkpointed_iteration.txt``). verl saves FSDP shards, which
  sglang cannot read: the step is merged once with ``python -m verl.model_merger merge --backend fsdp`` into
  ``global_step_N/huggingface_merged`` (next to the shards, so on the checkpoints volume), and later
  evaluations reuse that directory.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MERGED_DIR = "huggingface_merged"
LATEST_STEP_FILE = "latest_checkpointed_iteration.txt"  # written by verl next to the global_step_N folders
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class ModelPathError(ValueError):
    """MODEL_PATH is none of the accepted forms; the message says what was found and what to pass."""


@dataclass(frozen=True)
class ResolvedModel:
    """What to serve (``serve``: a directory or a hub id) and where it came from (``kind``)."""

    kind: str  # "hub" | "hf_dir" | "verl_checkpoint"
    serve: str
    checkpoint: Path | None = None  # the global_step_N directory, for a verl checkpoint
    merged_now: bool = False


def is_hf_model_dir(path: Path) -> bool:
    """A directory ``transformers``/sglang can load: ``config.json`` plus weights."""
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    return path.is_dir() and (path / "config.json").exists() and has_weights


def find_step_dir(path: Path) -> Path | None:
    """The ``global_step_N`` directory ``path`` names: itself, its parent (``actor/``), or the latest one of an
    experiment directory; None if ``path`` is not a verl checkpoint."""
    if _STEP_DIR.match(path.name) and (path / "actor").is_dir():
        return path
    if path.name == "actor" and _STEP_DIR.match(path.parent.name):
        return path.parent
    latest = path / LATEST_STEP_FILE
    if latest.exists():
        step = path / f"global_step_{latest.read_text().strip()}"
        if (step / "actor").is_dir():
            return step
    steps = sorted(
        (int(m.group(1)), child)
        for child in path.glob("global_step_*")
        if (m := _STEP_DIR.match(child.name)) and (child / "actor").is_dir()
    )
    return steps[-1][1] if steps else None


def merge_command(actor_dir: Path, target: Path, python: str | None = None) -> list[str]:
    """verl's own merger: FSDP shards + ``actor/huggingface`` (config, tokenizer) -> a Hugging Face model."""
    return [python or sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
            "--local_dir", str(actor_dir), "--target_dir", str(target)]  # fmt: skip


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelPathError(
            f"merging the verl checkpoint failed ({' '.join(command)}):\n{(result.stdout + result.stderr)[-3000:]}"
        )


def resolve_model_path(
    model_path: str | Path, python: str | None = None, run: Callable[[list[str]], None] = _run
) -> ResolvedModel:
    """Classify ``model_path`` and, for a verl checkpoint, merge it (once) into ``global_step_N/huggingface_merged``."""
    text = str(model_path).strip()
    if not text:
        raise ModelPathError(
            "MODEL_PATH is empty: give a hub id, a Hugging Face model directory or a global_step_N"
        )
    path = Path(text)
    if path.exists():
        if not path.is_dir():
            raise ModelPathError(f"MODEL_PATH {path} is a file: give a directory or a hub id")
        if is_hf_model_dir(path):
            return ResolvedModel(kind="hf_dir", serve=str(path))
        step = find_step_dir(path)
        if step is None:
            raise ModelPathError(
                f"MODEL_PATH {path} is neither a Hugging Face model directory (config.json + *.safetensors) nor a "
                f"verl checkpoint (global_step_N/actor, or an experiment directory holding global_step_N folders)"
            )
        target = step / MERGED_DIR
        if is_hf_model_dir(target):
            return ResolvedModel(kind="verl_checkpoint", serve=str(target), checkpoint=step)
        actor = step / "actor"
        if not (actor / "huggingface" / "config.json").exists() or not any(
            actor.glob("model_world_size_*_rank_*.pt")
        ):
            raise ModelPathError(
                f"{step} is an incomplete verl checkpoint: {actor} needs model_world_size_*_rank_*.pt shards and "
                "huggingface/config.json (was the run stopped while saving?)"
            )
        partial = step / (MERGED_DIR + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        run(merge_command(actor, partial, python))
        if not is_hf_model_dir(partial):
            raise ModelPathError(f"verl.model_merger wrote no model into {partial}")
        partial.rename(target)  # atomic: a half-merged directory is never taken for a model
        return ResolvedModel(kind="verl_checkpoint", serve=str(target), checkpoint=step, merged_now=True)
    if _HUB_ID.match(text) and not text.startswith((".", "/")):
        return ResolvedModel(kind="hub", serve=text)
    raise ModelPathError(
        f"MODEL_PATH {text} does not exist and is not a Hugging Face hub id (owner/name). Inside the containers "
        "checkpoints are under /outputs/checkpoints/<experiment>/global_step_N and local models under /models"
    )
