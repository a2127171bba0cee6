"""A short supervised warm start of the tiny model on the oracle's episodes, so that the rehearsal's rollouts
earn different rewards and GRPO has non-zero advantages to push through the update.

A random tiny model never names a valid action: every trajectory earns 0, every advantage is 0, and the policy
gradient is 0, so an update with the wrong sign would go unnoticed. After a few hundred steps of teacher forcing
on the oracle's replies (``Action: search[...]``, ``Action: click[...]``), sampling at temperature 1 gives a mix
of valid and invalid actions, wrong and right purchases: rewards that differ within a GRPO group.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import prompts

MARKER = "webshop-warm-start.json"


def oracle_examples(catalog_dir: Path, plans: Mapping[int, Sequence[str]], goal_set: str = "synthetic"
                    ) -> list[tuple[list[dict[str, str]], str]]:  # fmt: skip
    """(conversation so far, the oracle's next reply) for every step of every plan, as the agent loop shows it."""
    from webshop_env.catalog.store import open_catalog
    from webshop_env.core.env import WebShopEnv

    env = WebShopEnv(open_catalog(catalog_dir))
    examples = []
    for goal, plan in plans.items():
        step = env.reset(goal, goal_set=goal_set)
        messages = [{"role": "system", "content": prompts.SYSTEM_PROMPT},
                    {"role": "user", "content": prompts.first_user_message(step.instruction, step.observation,
                                                                           step.available_actions)}]  # fmt: skip
        for action in plan:
            reply = f"Action: {action}"
            examples.append((list(messages), reply))
            step = env.step(step.state, action)
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": prompts.step_message(step.observation, step.available_actions,
                                                                          action=action, valid=True)}]  # fmt: skip
    return examples


def warm_start(model_dir: Path, catalog_dir: Path, plans: Mapping[int, Sequence[str]], steps: int = 1500,
               lr: float = 3e-3, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Teacher-force the oracle's replies into the model at ``model_dir`` (in place; once per plan set)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = {
        "plans": {str(k): list(v) for k, v in sorted(plans.items())},
        "steps": steps,
        "lr": lr,
        "seed": seed,
    }
    marker = Path(model_dir) / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("recipe") == recipe:
        return json.loads(marker.read_text())
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    batches = []
    for messages, reply in oracle_examples(Path(catalog_dir), plans):
        context = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        context = list(context["input_ids"] if isinstance(context, Mapping) else context)
        target = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
        ids = torch.tensor([context + target])
        labels = torch.tensor([[-100] * len(context) + target])
        batches.append((ids, labels))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    order = random.Random(seed)
    losses = []
    for _ in range(steps):
        ids, labels = batches[order.randrange(len(batches))]
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.save_pretrained(model_dir)
    report = {"recipe": recipe, "examples": len(batches), "first_loss": round(losses[0], 3),
              "last_loss": round(sum(losses[-20:]) / min(20, len(losses)), 3)}  # fmt: skip
    marker.write_text(json.dumps(report))
    return report
