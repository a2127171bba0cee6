"""Save a verl FSDP checkpoint of a tiny model on CPU, with verl's own checkpoint manager (as the trainer does).

    python _save_verl_checkpoint.py MODEL_DIR STEP_DIR [fsdp2|fsdp]

MODEL_DIR: a Hugging Face model directory (the preflight's tiny model). Writes STEP_DIR/actor/ exactly as the
installed verl's FSDP actor writes ``global_step_N/actor`` (shards, fsdp_config.json, huggingface/), with the
model wrapped by FSDP2 (``fully_shard``: the training configs' ``strategy: fsdp2``, the default here) or FSDP1,
and STEP_DIR/reference.safetensors with the weights it saved, for comparison after a merge.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(model_dir: str, step_dir: str, strategy: str = "fsdp2") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
    from omegaconf import OmegaConf
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():  # weights that differ from the base model's, as after training
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    reference = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if strategy == "fsdp2":
        fsdp = fully_shard(
            model, mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
        )  # as verl names it
    else:
        fsdp = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    optimizer = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)
    manager = FSDPCheckpointManager(
        fsdp, optimizer, None, processing_class=AutoTokenizer.from_pretrained(model_dir),
        checkpoint_config=OmegaConf.create({"save_contents": ["model", "optimizer", "extra"], "load_contents": ["model"]}),
    )  # fmt: skip
    manager.save_checkpoint(
        str(Path(step_dir) / "actor"), global_step=int(Path(step_dir).name.rsplit("_", 1)[1])
    )
    save_file(reference, str(Path(step_dir) / "reference.safetensors"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
