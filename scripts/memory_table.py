#!/usr/bin/env python3
"""GPU memory of every training config, estimated from its sizes: the table of docs/training.md ("GPU memory").

    .venv/bin/python scripts/memory_table.py [--config-dir configs] [--card 80]

Per config, as Hydra composes it (its environment's file over its base), with its defaults (the knobs'
``${oc.env:NAME,default}`` values), per GPU:

- weights + gradients (fp32) + Adam: parameters x 16 B, over the GPUs (FSDP2 shards them); offloaded to the host
  where the config offloads the actor (``param_offload``);
- the largest buffer of the update: one micro-batch's logits, a padded sequence (``max_prompt_length +
  max_response_length``) times the vocabulary, in bf16 + fp32 copies for the log-softmax and entropy + the gradient
  (10 B a logit); the reference and old log-probs (no gradient: 6 B a logit) at their own micro-batch;
- sglang's share of the card (``gpu_memory_utilization``), which must hold its bf16 weights (over the rollout's
  tensor-parallel size) and a KV cache.

An estimate, not a measurement (no GPU was at hand). verl's hybrid engine puts sglang to sleep (its share freed)
while the actor updates, so the peak is the larger of two phases: the update (the weights' states where not
offloaded, the larger logits buffer, 6 GB for activations, CUDA context and fragmentation) and the rollout (the
states, sglang's share of the card, the 6 GB). A config "fits" a card when both are under it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

#: Parameters and vocabulary of the models the configs name (Qwen2.5's model cards).
MODELS = {"Qwen/Qwen2.5-0.5B-Instruct": 0.49e9, "Qwen/Qwen2.5-1.5B-Instruct": 1.54e9,
          "Qwen/Qwen2.5-3B-Instruct": 3.09e9, "Qwen/Qwen2.5-7B-Instruct": 7.62e9}  # fmt: skip
VOCAB = 151_936
OTHER_GB = 6.0  # activations (checkpointed), CUDA context, allocator fragmentation
GB = 1e9


def defaults_of(path: Path) -> Any:
    """The config at ``path`` as Hydra composes it (its environment's file over its base; the project's files only),
    resolved with every ``AGENTRL_*`` knob unset: its defaults."""
    from omegaconf import OmegaConf

    from agent_trainer.config import load_training_config

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("AGENTRL_", "WEBSHOP_"))}
    try:
        config = load_training_config(path.stem, directory=path.parent, with_verl=False, resolve=True)
    finally:
        os.environ.update(saved)
    return OmegaConf.to_container(config)


def _get(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """A dotted key's value, else ``default`` (verl's, where the project's files do not set it)."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def estimate(path: Path, card_gb: float) -> dict[str, object]:
    config = defaults_of(path)
    model = str(_get(config, "actor_rollout_ref.model.path", "?"))
    params = MODELS.get(model, 0.0)
    gpus = int(_get(config, "trainer.n_gpus_per_node", 1))
    sequence = int(_get(config, "data.max_prompt_length", 0)) + int(
        _get(config, "data.max_response_length", 0)
    )
    micro_update = int(_get(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 1))
    micro_logprob = max(int(_get(config, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 1)),
                        int(_get(config, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 1)))  # fmt: skip
    offload = bool(_get(config, "actor_rollout_ref.actor.fsdp_config.param_offload", False))
    sglang = float(_get(config, "actor_rollout_ref.rollout.gpu_memory_utilization", 0.5))
    states = params * 16 / gpus / GB
    update = micro_update * sequence * VOCAB * 10 / GB
    logprob = micro_logprob * sequence * VOCAB * 6 / GB
    kept = 0.0 if offload else states
    tp = int(_get(config, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1))
    serving = params * 2 / tp / GB * 1.3  # sglang's bf16 weights (its tensor-parallel share) and a KV cache

    def peak(card: float) -> float:
        if sglang * card < serving:  # sglang's share cannot hold its weights: does not fit at all
            return float("inf")
        return max(kept + max(update, logprob) + OTHER_GB, kept + sglang * card + OTHER_GB)

    return {"config": path.stem, "model": model.split("/")[-1], "gpus": gpus, "sequence": sequence,
            "states": states, "offload": offload, "update": update, "micro_update": micro_update,
            "logprob": logprob, "micro_logprob": micro_logprob, "sglang": sglang, "peak": peak(card_gb),
            "fits": [c for c in (24, 40, 48, 80, 141) if peak(c) <= c]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-dir", type=Path, default=Path(__file__).resolve().parents[1] / "configs")
    parser.add_argument(
        "--card", type=float, default=80.0, help="the card the 'resident' column assumes (GB)"
    )
    args = parser.parse_args(argv)
    rows = [estimate(p, args.card) for p in sorted(args.config_dir.glob("*_grpo_*.yaml"))]
    if not rows:
        print(f"no *_grpo_*.yaml in {args.config_dir}", file=sys.stderr)
        return 2
    print(
        f"| config | model, GPUs | sequence (padded) | weights + grads + Adam per GPU | update logits "
        f"(micro-batch) | log-prob logits (micro-batch) | peak on a {args.card:.0f} GB card | fits (GB cards) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        states = f"{r['states']:.0f} GB" + (", offloaded to the host" if r["offload"] else "")
        fits = ", ".join(str(c) for c in r["fits"]) or "none of 24-141"  # type: ignore[attr-defined]
        print(
            f"| `{r['config']}` | {r['model']}, {r['gpus']} | {r['sequence']:,} | {states} | "
            f"{r['update']:.0f} GB ({r['micro_update']}) | {r['logprob']:.0f} GB ({r['micro_logprob']}) | "
            f"{r['peak']:.0f} GB | {fits} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
