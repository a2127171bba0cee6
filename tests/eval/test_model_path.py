"""``make eval MODEL_PATH=...``: a hub id, a Hugging Face directory, or a verl global_step_N merged once by
verl's own merger (checkpoint saved on CPU by verl's own FSDP checkpoint manager)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="the merge needs verl: pip install -c constraints.txt -e services/trainer")

from agent_trainer.evaluation import policies
from agent_trainer.evaluation.model_path import (
    MERGED_DIR,
    ModelPathError,
    find_step_dir,
    resolve_model_path,
)
from agent_trainer.evaluation.policies import CheckpointPolicy, PolicyError, serveable_model

SAVER = Path(__file__).with_name("_save_verl_checkpoint.py")


def test_hub_ids_are_served_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    resolved = resolve_model_path("Qwen/Qwen2.5-1.5B-Instruct")
    assert (resolved.kind, resolved.serve) == ("hub", "Qwen/Qwen2.5-1.5B-Instruct")
    for missing in ("/outputs/checkpoints/run/global_step_5", "./model", "just-a-name", "a/b/c"):
        with pytest.raises(ModelPathError, match="does not exist and is not a Hugging Face hub id"):
            resolve_model_path(missing)


def test_hf_directories_are_served_and_other_directories_refused(tmp_path: Path) -> None:
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    assert resolve_model_path(model).kind == "hf_dir" and resolve_model_path(model).serve == str(model)
    with pytest.raises(ModelPathError, match="neither a Hugging Face model directory"):
        resolve_model_path(tmp_path / "hf" / ".." / "..")
    empty_step = tmp_path / "run" / "global_step_3" / "actor"
    empty_step.mkdir(parents=True)
    with pytest.raises(ModelPathError, match="incomplete verl checkpoint"):
        resolve_model_path(empty_step.parent)
    with pytest.raises(PolicyError, match="incomplete verl checkpoint"):  # what the checkpoint policy raises
        serveable_model(empty_step.parent)


def test_the_latest_step_of_an_experiment_directory(tmp_path: Path) -> None:
    for step in (2, 10, 4):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
    assert find_step_dir(tmp_path) == tmp_path / "global_step_10"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")  # what verl's trainer writes
    assert find_step_dir(tmp_path) == tmp_path / "global_step_4"
    assert find_step_dir(tmp_path / "global_step_2" / "actor") == tmp_path / "global_step_2"
    assert find_step_dir(tmp_path / "global_step_2" / "elsewhere") is None


@pytest.fixture(scope="module")
def verl_checkpoint(tmp_path_factory: pytest.TempPathFactory, generated_catalog_dir: Path) -> Path:
    from agent_trainer.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("ckpt")
    model_dir = build_tiny_model(root / "tiny", generated_catalog_dir)
    step = root / "webshop_grpo_test" / "global_step_2"
    result = subprocess.run([sys.executable, str(SAVER), str(model_dir), str(step)], capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (step.parent / "latest_checkpointed_iteration.txt").write_text("2")
    return step


def test_a_verl_checkpoint_is_merged_once_with_verls_merger(verl_checkpoint: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    assert any((verl_checkpoint / "actor").glob("model_world_size_1_rank_0.pt"))
    assert not (verl_checkpoint / MERGED_DIR).exists()
    first = resolve_model_path(verl_checkpoint.parent)  # the experiment directory: its latest step
    assert first.kind == "verl_checkpoint" and first.merged_now
    assert first.serve == str(verl_checkpoint / MERGED_DIR) and first.checkpoint == verl_checkpoint
    merged = AutoModelForCausalLM.from_pretrained(first.serve, dtype=torch.float32).state_dict()
    reference = load_file(str(verl_checkpoint / "reference.safetensors"))
    for name, tensor in reference.items():
        if name in merged:  # tied embeddings may be stored once
            # the merger writes the config's dtype (bf16): equal up to its rounding, far below the 0.01 perturbation
            assert torch.allclose(merged[name].float(), tensor, rtol=1e-2, atol=1e-3), name
    assert (Path(first.serve) / "tokenizer_config.json").exists()

    calls: list[list[str]] = []
    again = resolve_model_path(verl_checkpoint / "actor", run=calls.append)  # the actor folder works too
    assert again.serve == first.serve and not again.merged_now and calls == []  # merged once, then reused


def test_the_checkpoint_policy_serves_the_merged_directory(
    verl_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve = serveable_model(verl_checkpoint)
    policy = CheckpointPolicy(verl_checkpoint, port=31299)
    monkeypatch.setattr(policies, "serveable_model", lambda path, python=None: serve)
    policy.serve_path = policies.serveable_model(policy.model_path)
    command = policy.command()
    assert command[command.index("--model-path") + 1] == str(verl_checkpoint / MERGED_DIR)
