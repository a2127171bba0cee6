"""Token generation with a Hugging Face causal LM on CPU: what the rehearsal's rollout servers (training) and its
chat server (eval of the merged model) both run, so training and eval sample the same way.

The log-probabilities reported with each token are those of the distribution the token was sampled from at the
request's temperature, ``log_softmax(logits / T)``: what verl's actor computes for the same tokens
(``old_log_probs`` divide the logits by ``rollout.temperature``), so verl's rollout-vs-actor comparisons are
like for like. Greedy decoding (T = 0) reports ``log_softmax(logits)``.
"""

from __future__ import annotations

import torch


def sample_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                 generator: torch.Generator) -> int:  # fmt: skip
    """Greedy at temperature 0; else temperature, top-k and top-p (nucleus) sampling."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    scaled = logits / temperature
    if top_k > 0:
        kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, -1)
    if top_p < 1.0:
        ordered, index = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, 0) - ordered < top_p
        probs = torch.where(
            torch.zeros_like(probs, dtype=torch.bool).scatter(0, index[keep], True), probs, 0.0
        )
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate_tokens(model: torch.nn.Module, prompt_ids: list[int], limit: int, *, temperature: float, top_k: int,
                    top_p: float, generator: torch.Generator, eos_ids: set[int]
                    ) -> tuple[list[int], list[float], bool]:  # fmt: skip
    """Up to ``limit`` new tokens with a KV cache: ``(tokens, their log-probabilities, ended on an eos)``."""
    produced: list[int] = []
    log_probs: list[float] = []
    if limit <= 0:
        return produced, log_probs, False
    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    past, logits = out.past_key_values, out.logits[0, -1].float()
    for _ in range(limit):
        token = sample_token(logits, temperature, top_k, top_p, generator)
        produced.append(token)
        log_probs.append(float(torch.log_softmax(_scaled(logits, temperature), -1)[token]))
        if token in eos_ids:
            return produced, log_probs, True
        out = model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1].float()
    return produced, log_probs, False


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature if temperature > 0 else logits


@torch.no_grad()
def score_tokens(model: torch.nn.Module, prompt_ids: list[int], response_ids: list[int], temperature: float
                 ) -> list[float]:  # fmt: skip
    """Teacher-forced log-probabilities of ``response_ids`` after ``prompt_ids`` at ``temperature`` (as
    :func:`generate_tokens` reports them, and as verl's actor computes ``old_log_probs``)."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    log_probs = torch.log_softmax(_scaled(logits, temperature), -1)
    return log_probs.gather(1, torch.tensor(response_ids).unsqueeze(1)).squeeze(1).tolist()
