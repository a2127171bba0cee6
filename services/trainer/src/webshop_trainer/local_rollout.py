"""verl's real agent-loop path on CPU, without Ray or an inference server.

``LocalAgentLoopWorker`` is verl 0.7.1's own ``AgentLoopWorker`` with two seams filled in-process:

- the LLM server manager: anything with ``async generate(request_id, *, prompt_ids, sampling_params,
  image_data=None, video_data=None) -> TokenOutput``; here ``TinyModelServer`` (a tiny HF model, torch on
  CPU) or ``ScriptedServer`` (replies with a fixed plan of actions per goal, e.g. the oracle's);
- the reward-loop worker handle: verl's own ``RewardLoopWorker`` behind a shim whose ``.remote()`` is a
  coroutine. The data goes through a pickle round trip first, as it would through Ray.

Everything else is verl's code: ``generate_sequences`` picks the agent loop by the row's ``agent_name``,
instantiates ``ToolAgentLoop`` per trajectory (which builds our interaction from the interaction config),
pads, scores through the configured reward function and assembles the output ``DataProto``.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.rollout.replica import TokenOutput

_INSTRUCTION = re.compile(r"<\|im_start\|>user\nInstruction: (.*?)\n")
_ASSISTANT_TURN = "<|im_start|>assistant\n"


class TinyModelServer:
    """Generates with a local HF causal LM on CPU (one generation at a time; greedy or sampled)."""

    def __init__(self, model_dir: str, max_new_tokens: int = 24, seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, attn_implementation="sdpa", dtype=torch.float32
        )
        self.model.eval()
        self.max_new_tokens = max_new_tokens
        self.generator = torch.Generator().manual_seed(seed)
        self.calls = 0
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
        return TokenOutput(
            token_ids=token_ids, log_probs=log_probs if wanted else None, stop_reason="completed"
        )

    def _generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        temperature = float(sampling_params.get("temperature") or 0.0)
        top_k = int(sampling_params.get("top_k") or -1)
        limit = min(self.max_new_tokens, int(sampling_params.get("max_tokens") or self.max_new_tokens))
        eos = self.tokenizer.eos_token_id
        with self._lock, torch.no_grad():
            self.calls += 1
            input_ids = torch.tensor([prompt_ids], dtype=torch.long)
            out = self.model(input_ids=input_ids, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
            produced: list[int] = []
            log_probs: list[float] = []
            for _ in range(limit):
                if temperature > 0:
                    scaled = logits / temperature
                    if top_k > 0:
                        kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
                        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
                    token = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=self.generator))
                else:
                    token = int(torch.argmax(logits))
                produced.append(token)
                log_probs.append(float(torch.log_softmax(logits, -1)[token]))
                if token == eos:
                    break
                out = self.model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1]
        return produced, log_probs


class ScriptedServer:
    """Replies ``Action: <plan[k]>`` at the k-th assistant turn of the goal whose instruction the prompt shows.

    ``plans`` maps instruction text -> actions; after the plan it keeps clicking ``buy now``.
    """

    def __init__(self, tokenizer: Any, plans: Mapping[str, Sequence[str]]) -> None:
        self.tokenizer = tokenizer
        self.plans = {k: list(v) for k, v in plans.items()}
        self.calls = 0

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
        turn = max(0, text.count(_ASSISTANT_TURN) - 1)
        action = plan[turn] if turn < len(plan) else "click[buy now]"
        reply = f"I will do this next.\nAction: {action}"
        token_ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        log_probs = [0.0] * len(token_ids) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, stop_reason="completed")


class _Remote:
    def __init__(self, function: Any) -> None:
        self._function = function

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._function(*args, **kwargs)


class LocalRewardHandle:
    """Stands in for a Ray handle of ``RewardLoopWorker``: ``await handle.compute_score.remote(data)``."""

    def __init__(self, worker: RewardLoopWorker) -> None:
        self.worker = worker
        self.compute_score = _Remote(self._compute_score)

    async def _compute_score(self, data: DataProto) -> dict[str, Any]:
        copied = pickle.loads(pickle.dumps(data))  # what Ray's serialization would do
        return await self.worker.compute_score(copied)


class LocalAgentLoopWorker(AgentLoopWorker):
    """verl's AgentLoopWorker with an in-process server manager and reward worker (no Ray)."""

    def __init__(
        self, config: DictConfig, server_manager: Any, reward_worker: RewardLoopWorker | None = None
    ) -> None:
        handles = [LocalRewardHandle(reward_worker)] if reward_worker is not None else None
        if "llm_client" in inspect.signature(AgentLoopWorker.__init__).parameters:  # verl >= 0.9
            super().__init__(config, llm_client=server_manager, reward_loop_worker_handles=handles)
            return
        self.server_manager = server_manager  # AgentLoopWorker keeps a preset server_manager ("for recipe")
        super().__init__(config, servers=[], load_balancer_handle=None, reward_loop_worker_handles=handles)


def generation_batch(samples: Sequence[dict[str, Any]], n: int) -> DataProto:
    """Dataset items -> the batch the trainer hands to the agent loop (``_get_gen_batch`` + repeat)."""
    batch = DataProto.from_single_dict(collate_fn(list(samples)))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    reward_keys = {"data_source", "reward_model", "extra_info", "uid"} & batch.non_tensor_batch.keys()
    gen_batch = batch.pop(
        batch_keys=[], non_tensor_batch_keys=list(set(batch.non_tensor_batch) - reward_keys)
    )
    gen_batch.non_tensor_batch.update(batch.non_tensor_batch)
    gen_batch.meta_info["global_steps"] = 0
    return gen_batch.repeat(repeat_times=n, interleave=True)


def summarize_output(output: DataProto) -> dict[str, Any]:
    """Per-trajectory rewards and metrics from ``generate_sequences``' output."""
    has_scores = "rm_scores" in output.batch.keys()  # noqa: SIM118 - TensorDict has no `in`
    scores = output.batch["rm_scores"].sum(dim=-1).tolist() if has_scores else []
    keys = output.meta_info.get("reward_extra_keys", [])
    extras = {k: [float(x) for x in output.non_tensor_batch[k]] for k in keys if k in output.non_tensor_batch}
    turns = [int(x) for x in output.non_tensor_batch.get("__num_turns__", [])]
    return {"scores": [float(s) for s in scores], "extras": extras, "num_turns": turns}
