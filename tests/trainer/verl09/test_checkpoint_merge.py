"""A verl 0.9.1 checkpoint, written on CPU by verl 0.9.1's own FSDP checkpoint manager from an FSDP2 model (the
training configs' ``strategy: fsdp2``), is merged by 0.9.1's merger (what ``make eval VERL_LINE=0.9`` runs in
the 0.9 image) into a model this line's transformers loads with the weights that were saved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

SAVER = Path(__file__).resolve().parents[2] / "eval" / "_save_verl_checkpoint.py"
pytestmark = pytest.mark.slow


def test_a_0_9_checkpoint_is_merged_by_the_0_9_merger_and_loads(
    generated_catalog_dir: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from agent_trainer.evaluation.model_path import MERGED_DIR, resolve_model_path
    from agent_trainer.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", generated_catalog_dir)
    step = tmp_path / "webshop_grpo_test" / "global_step_3"
    saved = subprocess.run([sys.executable, str(SAVER), str(model_dir), str(step), "fsdp2"], capture_output=True,
                           text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert saved.returncode == 0, saved.stderr[-3000:]
    (step.parent / "latest_checkpointed_iteration.txt").write_text("3")

    resolved = resolve_model_path(step.parent)  # runs `python -m verl.model_merger` with this line's python
    assert resolved.kind == "verl_checkpoint" and resolved.serve == str(step / MERGED_DIR)
    merged = AutoModelForCausalLM.from_pretrained(resolved.serve, dtype=torch.float32).state_dict()
    reference = load_file(str(step / "reference.safetensors"))
    compared = 0
    for name, tensor in reference.items():
        if name in merged:  # tied embeddings may be stored once
            assert torch.allclose(merged[name].float(), tensor, rtol=1e-2, atol=1e-3), name
            compared += 1
    assert compared >= len(reference) - 1
    assert (Path(resolved.serve) / "tokenizer_config.json").exists()
