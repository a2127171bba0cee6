"""A short supervised warm start of the tiny model on the oracle's episodes, so that the rehearsal's rollouts
earn different rewards and GRPO has non-zero advantages to push through the update.

A random tiny model never names a valid action: every trajectory earns 0, every advantage is 0, and the policy
gradient is 0, so an update with the wrong sign would go unnoticed. Teacher forcing on the oracle's replies
(``Action: search[...]``, ``Action: click[...]``), each step one whole episode as the agent loop's token stream
shows it (every reply of the episode supervised at once), makes the model replay the plans of the run's goals;
sampled hot, it gives a mix of valid and invalid actions, wrong and right purchases: rewards that differ within a
GRPO group, and purchases that earn an env reward. (A 2-layer model does not learn to copy a product ID from the
page within a warm start's budget: it has to remember the run's plans.)
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import prompts

MARKER = "webshop-warm-start.json"


def oracle_examples(catalog_dir: Path, plans: Mapping[int, Sequence[str]], goal_set: str = "synthetic",
                    max_observation_chars: int = 0) -> list[tuple[list[dict[str, str]], str]]:  # fmt: skip
    """(conversation so far, the oracle's next reply) for every step of every plan, as the agent loop shows it
    (pages cut at ``max_observation_chars``, as the run's agent loop cuts them)."""
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
                         {"role": "user", "content": prompts.step_message(
                             step.observation, step.available_actions, action=action, valid=True,
                             max_observation_chars=max_observation_chars)}]  # fmt: skip
    return examples


def episode_streams(tokenizer: Any, examples: Sequence[tuple[list[dict[str, str]], str]]
                    ) -> list[tuple[list[int], list[int]]]:  # fmt: skip
    """One ``(ids, labels)`` per episode of ``examples`` (as :func:`oracle_examples` lists them): the token stream
    the agent loop builds (the chat template's render of each new context appended, the reply's tokens and the
    end-of-turn token after each), the labels -100 except on the replies."""

    def render(messages: list[dict[str, str]]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    streams: list[tuple[list[int], list[int]]] = []
    ids: list[int] = []
    labels: list[int] = []
    for messages, reply in examples:
        context = render(messages)
        if context[: len(ids)] != ids or len(messages) <= 2:  # a new episode (its first turn)
            if ids:
                streams.append((ids, labels))
            ids, labels = [], []
        new = context[len(ids) :]
        target = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
        ids = ids + new + target
        labels = labels + [-100] * len(new) + target
    if ids:
        streams.append((ids, labels))
    return streams


def _recipe(plans: Mapping[int, Sequence[str]], steps: int, lr: float, seed: int, max_observation_chars: int
            ) -> dict[str, Any]:  # fmt: skip
    return {"plans": {str(k): list(v) for k, v in sorted(plans.items())}, "steps": steps, "lr": lr, "seed": seed,
            "unit": "episode",
            **({"max_observation_chars": max_observation_chars} if max_observation_chars else {})}  # fmt: skip


def stale(model_dir: Path, plans: Mapping[int, Sequence[str]], steps: int = 1500, lr: float = 3e-3, seed: int = 0,
          max_observation_chars: int = 0) -> bool:  # fmt: skip
    """Whether ``model_dir`` was warm-started with another recipe (then it must be rebuilt before a warm start:
    one trains the weights in place)."""
    marker = Path(model_dir) / MARKER
    return marker.exists() and json.loads(marker.read_text()).get("recipe") != _recipe(
        plans, steps, lr, seed, max_observation_chars
    )


def warm_start(model_dir: Path, catalog_dir: Path, plans: Mapping[int, Sequence[str]], steps: int = 1500,
               lr: float = 3e-3, seed: int = 0, max_observation_chars: int = 0) -> dict[str, Any]:  # fmt: skip
    """Teacher-force the oracle's replies into the model at ``model_dir`` (in place; once per plan set)."""
    import torch

    recipe = _recipe(plans, steps, lr, seed, max_observation_chars)
    marker = Path(model_dir) / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("recipe") == recipe:
        return json.loads(marker.read_text())
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # as every process of the run: two threads on a busy 2-core machine run 5-20x slower
    try:
        return _train(model_dir, catalog_dir, plans, recipe, steps, lr, seed, max_observation_chars)
    finally:
        torch.set_num_threads(threads)


def _train(model_dir: Path, catalog_dir: Path, plans: Mapping[int, Sequence[str]], recipe: dict[str, Any],
           steps: int, lr: float, seed: int, max_observation_chars: int) -> dict[str, Any]:  # fmt: skip
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = Path(model_dir) / MARKER
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    batches = [(torch.tensor([ids]), torch.tensor([labels]))
               for ids, labels in episode_streams(tokenizer, oracle_examples(Path(catalog_dir), plans,
                                                                             max_observation_chars=max_observation_chars))]  # fmt: skip
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
    report = {"recipe": recipe, "episodes": len(batches), "first_loss": round(losses[0], 3),
              "last_loss": round(sum(losses[-20:]) / min(20, len(losses)), 3)}  # fmt: skip
    marker.write_text(json.dumps(report))
    return report
