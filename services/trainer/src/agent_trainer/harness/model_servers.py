"""The stand-in model servers verl's agent-loop worker generates with on CPU, in this process.

verl's worker asks its LLM server manager for ``async generate(request_id, *, prompt_ids, sampling_params,
image_data=None, video_data=None) -> TokenOutput``; these answer that, without GPU workers or an inference server:

- ``TinyModelServer``: a tiny HF causal LM (torch on CPU): the path runs with a model's real, random replies;
- ``ScriptedServer``: replies with a fixed plan of WebShop actions per goal (the oracle's), found by the prompt's
  instruction: every trajectory must then earn its reward, so one that does not points at the path;
- ``PlanByOpeningServer``: the same for any environment or a mix, the plan found by the trajectory's first user
  turn.

Each reports the weights version (``global_steps``) in ``TokenOutput.extra_fields`` as verl 0.9.1's sglang server
does once it is told one (``set_global_steps``), so the v1 trainer's bookkeeping accepts their trajectories.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from verl.workers.rollout.replica import TokenOutput

_INSTRUCTION = re.compile(r"<\|im_start\|>user\nInstruction: (.*?)\n")
#: Where each assistant turn starts in a prompt the chat template rendered: the scripted servers count them to
#: know which step of the plan comes next.
ASSISTANT_TURN = "<|im_start|>assistant\n"


class StandInServer:
    """What every in-process rollout server shares: the weights version (verl 0.9.1 tells its servers at every
    weight sync, and they report it in each ``TokenOutput``) and a call count."""

    def __init__(self) -> None:
        self.calls = 0
        self.global_steps: int | None = None

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def _output(self, token_ids: list[int], log_probs: list[float] | None) -> TokenOutput:
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, stop_reason="completed",
                           extra_fields=_version_fields(self.global_steps))  # fmt: skip


class TinyModelServer(StandInServer):
    """Generates with a local HF causal LM on CPU (one generation at a time; greedy or sampled)."""

    def __init__(self, model_dir: str, max_new_tokens: int = 24, seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        super().__init__()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, attn_implementation="sdpa", dtype=torch.float32
        )
        self.model.eval()
        self.max_new_tokens = max_new_tokens
        self.generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: Mapping[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,  # verl 0.9.1 adds audio_data, mm_processor_kwargs
    ) -> TokenOutput:
        loop = asyncio.get_running_loop()
        token_ids, log_probs = await loop.run_in_executor(
            None, self._generate, list(prompt_ids), dict(sampling_params)
        )
        wanted = bool(sampling_params.get("logprobs"))  # verl 0.9.1 asks by default (calculate_log_probs)
        return self._output(token_ids, log_probs if wanted else None)

    def _generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        from ..rehearsal.generation import generate_tokens

        limit = min(self.max_new_tokens, int(sampling_params.get("max_tokens") or self.max_new_tokens))
        with self._lock:
            self.calls += 1
            tokens, log_probs, _ = generate_tokens(
                self.model, prompt_ids, limit, temperature=float(sampling_params.get("temperature") or 0.0),
                top_k=int(sampling_params.get("top_k") or -1), top_p=float(sampling_params.get("top_p") or 1.0),
                generator=self.generator, eos_ids={self.tokenizer.eos_token_id},
            )  # fmt: skip
        return tokens, log_probs


class ScriptedServer(StandInServer):
    """Replies ``Action: <plan[k]>`` at the k-th assistant turn of the goal whose instruction the prompt shows.

    ``plans`` maps instruction text -> actions; after the plan it keeps clicking ``buy now``.
    """

    def __init__(self, tokenizer: Any, plans: Mapping[str, Sequence[str]]) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.plans = {k: list(v) for k, v in plans.items()}

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: Mapping[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        self.calls += 1
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        match = _INSTRUCTION.search(text)
        if match is None or match.group(1) not in self.plans:
            raise RuntimeError(f"scripted policy: no plan for the prompt of request {request_id}")
        plan = self.plans[match.group(1)]
        turn = max(0, text.count(ASSISTANT_TURN) - 1)
        action = plan[turn] if turn < len(plan) else "click[buy now]"
        reply = f"I will do this next.\nAction: {action}"
        token_ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        log_probs = [0.0] * len(token_ids) if sampling_params.get("logprobs") else None
        return self._output(token_ids, log_probs)


class PlanByOpeningServer(StandInServer):
    """The scripted oracle of a mixed batch: replies ``Action: <plan[k]>`` at the k-th assistant turn of the
    trajectory whose prompt holds one of ``plans``' first user turns (every environment parses that reply)."""

    def __init__(self, tokenizer: Any, plans: Mapping[str, Sequence[str]]) -> None:
        super().__init__()
        self.tokenizer, self.plans = tokenizer, {k: list(v) for k, v in plans.items()}

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> TokenOutput:  # fmt: skip
        from ..evaluation.policies import as_agentgym_reply

        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        plan = next((p for opening, p in self.plans.items() if opening in text), None)
        if plan is None:
            raise RuntimeError(f"scripted policy: no plan for the prompt of request {request_id}")
        turn = max(0, text.count(ASSISTANT_TURN) - 1)
        reply = "Thought: the plan's next step.\n" + as_agentgym_reply(plan[min(turn, len(plan) - 1)])
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        self.calls += 1
        return self._output(ids, [0.0] * len(ids) if sampling_params.get("logprobs") else None)


def _version_fields(global_steps: int | None) -> dict[str, Any]:
    """What verl 0.9.1's sglang server puts into every ``TokenOutput.extra_fields`` once it knows the weights
    version (``{"global_steps": N}``); nothing before (verl 0.7.1's server reports none)."""
    return {} if global_steps is None else {"global_steps": global_steps}
