"""A tiny random-weight causal LM and a tokenizer, built locally (no hub download).

The preflight runs verl's real agent loop on CPU; it needs a model directory that verl's ``HFModelConfig``
and ``hf_tokenizer`` load like a real one: ``config.json``, weights, a fast tokenizer with a chat template
(ChatML, as Qwen uses) and a generation config. The tokenizer is a byte-level BPE trained on the catalog's own
text (instructions, pages) plus the prompts, so every string round-trips and pages tokenize to realistic
lengths. Weights are random: the model's replies are noise, which exercises the invalid-reply path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from agent_envs.envs.webshop.catalog.store import open_catalog
from agent_envs.envs.webshop.core.env import WebShopEnv

from .envs.webshop import prompts

BOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS, IM_START, IM_END]

# ChatML, like Qwen2.5's template without the default system prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MARKER = "tiny-model.json"


def catalog_texts(catalog_dir: Path | str, goals: int = 200) -> Iterator[str]:
    """Text to train the tokenizer on: prompts, plus start and result pages of the first goals."""
    yield prompts.SYSTEM_PROMPT
    yield prompts.INVALID_REPLY_MESSAGE
    catalog = open_catalog(catalog_dir)
    env = WebShopEnv(catalog)
    goal_set = "synthetic" if "synthetic" in catalog.goal_sets else catalog.goal_sets[0]
    for goal in range(min(goals, catalog.goal_count(goal_set))):
        first = env.reset(goal, goal_set=goal_set)
        yield prompts.first_user_message(first.instruction, first.observation, first.available_actions)
        if goal % 4 == 0:
            record = env.goal(goal_set, goal)
            page = env.step(first.state, f"search[{record.query or record.name}]")
            yield prompts.page_text(page.observation, page.available_actions)
            yield f"Action: search[{record.query}]\nAction: click[{record.asin.lower()}]\nAction: click[buy now]"


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2048):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=IM_END, pad_token=BOS, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out: Path | str,
    catalog_dir: Path | str | None,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    vocab_size: int = 2048,
    seed: int = 0,
    force: bool = False,
    texts: Sequence[str] | None = None,
) -> Path:
    """Write a tiny Qwen2-architecture model + tokenizer to ``out`` (reused when already built the same way).
    ``texts``: what the tokenizer is trained on instead of the catalog's texts (another environment's prompts and
    episodes; ``catalog_dir`` may then be None)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    recipe = {"hidden_size": hidden_size, "layers": layers, "heads": heads, "vocab_size": vocab_size, "seed": seed,
              "catalog": open_catalog(catalog_dir).fingerprint if texts is None else None}  # fmt: skip
    if texts is not None:
        recipe["texts"] = hashlib.sha256("\0".join(texts).encode()).hexdigest()
    marker = out / MARKER
    if not force and marker.exists():
        try:
            if json.loads(marker.read_text()) == recipe:
                return out
        except ValueError:
            pass
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(catalog_texts(catalog_dir) if texts is None else texts, vocab_size=vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps(recipe))
    return out
