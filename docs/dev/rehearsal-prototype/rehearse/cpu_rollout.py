"""CPU stand-in for verl's async rollout engine (sglang) -- prototype for `make rehearse`.

Three pieces, mirroring verl's sglang integration (verl 0.7.1 / 0.9.1):

* ``CpuLLMServer``   -- Ray actor, one per replica; fills the role of ``SGLangHttpServer``
                        (``generate(prompt_ids, sampling_params, request_id, ...) -> TokenOutput``, ``wake_up``,
                        ``sleep``, ``clear_kv_cache``, ``abort_all_requests``, ``resume_generation``,
                        ``set_global_steps``, ``start_profile``/``stop_profile``, ``get_server_address``) plus
                        ``update_weights(state_dict, global_steps)`` (the weight sync target).
* ``CpuReplica``     -- ``verl.workers.rollout.replica.RolloutReplica`` subclass (``launch_servers``), registered in
                        ``RolloutReplicaRegistry`` under the rollout name; used by ``AgentLoopManager`` in the
                        TaskRunner process.
* ``CpuServerAdapter`` -- ``verl.workers.rollout.base.BaseRollout`` subclass living inside each FSDP
                        ActorRolloutRef worker (hybrid engine): ``resume(tags)``, ``release()``,
                        ``update_weights(weights, global_steps=None, **kw)``; registered in
                        ``verl.workers.rollout.base._ROLLOUT_REGISTRY[(name, "async")]``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any, Optional

import ray
import torch

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

logger = logging.getLogger(__name__)

SERVER_NAME = "cpu_rollout_server_{replica}_{node}"


class CpuLLMServer:
    """Token-in/token-out generation with an HF causal LM on CPU; weights replaced at every sync."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int, node_rank: int = 0, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig  # noqa: F401

        torch.set_num_threads(1)
        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        path = self.model_config.local_path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)
        self.model.eval()
        self.replica_rank, self.node_rank = replica_rank, node_rank
        self.generator = torch.Generator().manual_seed(seed + replica_rank)
        self.global_steps: Optional[int] = None
        self.weight_version = 0
        self.sleeping = False
        self.calls = 0
        self._lock = threading.Lock()
        eos = self.model_config.generation_config.eos_token_id if self.model_config.generation_config else None
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.eos_ids.add(self.tokenizer.eos_token_id)
        self._address = f"cpu-rollout-{replica_rank}-{node_rank}"

    # --- what RolloutReplica / AgentLoopManager / the load balancer use ---------------------------------
    def get_server_address(self):
        return self._address, 0

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,  # 0.9.1 adds audio_data, mm_processor_kwargs, priority
    ) -> TokenOutput:
        loop = asyncio.get_running_loop()
        sp = dict(sampling_params)
        token_ids, log_probs, reason = await loop.run_in_executor(None, self._generate, list(prompt_ids), sp)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if sp.get("logprobs") else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    def _generate(self, prompt_ids: list[int], sp: dict[str, Any]):
        cfg = self.config
        budget = cfg.prompt_length + cfg.response_length - len(prompt_ids)
        limit = sp.get("max_new_tokens", sp.get("max_tokens"))
        limit = min(cfg.response_length, budget) if limit is None else min(int(limit), budget)
        limit = max(0, limit)
        temperature = float(sp.get("temperature") or 0.0)
        top_k = int(sp.get("top_k") or -1)
        top_p = float(sp.get("top_p") or 1.0)
        produced: list[int] = []
        lps: list[float] = []
        with self._lock, torch.no_grad():
            self.calls += 1
            if limit == 0:
                return produced, lps, "length"
            out = self.model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
            for _ in range(limit):
                logp = torch.log_softmax(logits, -1)
                if temperature > 0:
                    scaled = logits / temperature
                    if top_k > 0:
                        kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
                        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
                    probs = torch.softmax(scaled, -1)
                    if top_p < 1.0:
                        sp_, idx = torch.sort(probs, descending=True)
                        keep = torch.cumsum(sp_, 0) - sp_ < top_p
                        mask = torch.zeros_like(probs, dtype=torch.bool).scatter(0, idx[keep], True)
                        probs = torch.where(mask, probs, torch.zeros_like(probs))
                    token = int(torch.multinomial(probs, 1, generator=self.generator))
                else:
                    token = int(torch.argmax(logits))
                produced.append(token)
                lps.append(float(logp[token]))
                if token in self.eos_ids:
                    return produced, lps, "stop"
                out = self.model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1].float()
        return produced, lps, "length"

    # --- weight sync (called from CpuServerAdapter in the FSDP worker) -----------------------------------
    def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: Optional[int] = None):
        own = self.model.state_dict()
        unknown = [k for k in state_dict if k not in own]
        missing = [k for k in own if k not in state_dict]
        with self._lock:
            self.model.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False)
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        checksum = float(sum(v.float().sum() for v in state_dict.values()))
        print(
            f"[CpuLLMServer {self.replica_rank}] weights v{self.weight_version} step={global_steps} "
            f"tensors={len(state_dict)} unknown={unknown[:3]} missing={missing[:3]} checksum={checksum:.6f}",
            flush=True,
        )
        return {"version": self.weight_version, "unknown": unknown, "missing": missing, "checksum": checksum}

    def stats(self):
        return {"calls": self.calls, "weight_version": self.weight_version, "global_steps": self.global_steps}

    # --- lifecycle, as SGLangHttpServer ------------------------------------------------------------------
    async def wake_up(self):
        self.sleeping = False

    async def sleep(self):
        self.sleeping = True

    async def clear_kv_cache(self):
        pass

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def abort_all_requests(self, reject_request: bool = False):
        pass

    async def release_kv_cache(self):  # 0.9.1
        pass

    async def resume_kv_cache(self):  # 0.9.1
        pass

    async def resume_generation(self):
        pass

    async def start_profile(self, **kwargs):
        pass

    async def stop_profile(self):
        pass


class CpuReplica(RolloutReplica):
    """One CpuLLMServer actor per replica (hybrid: the replica's FSDP workers push weights to it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CpuLLMServer)

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        name = SERVER_NAME.format(replica=self.replica_rank, node=0)
        server = self.server_class.options(
            name=name,
            num_cpus=0,
            max_concurrency=self.max_concurrency,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        self.servers = [server]
        address, port = await server.get_server_address.remote()
        self._server_handle = server
        self._server_address = f"{address}:{port}" if port else address


class CpuServerAdapter(BaseRollout):
    """Hybrid-engine side (inside each FSDP worker), as sglang_rollout.ServerAdapter."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        rollout_world_size = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self._server = None

    def _is_leader(self) -> bool:
        if self.device_mesh is None:
            return self.rollout_rank == 0
        return self.device_mesh["infer_tp"].get_local_rank() == 0

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(SERVER_NAME.format(replica=self.replica_rank, node=0))
        return self._server

    async def resume(self, tags: list[str]):
        if self._is_leader():
            await self._server_handle().wake_up.remote()

    async def release(self):
        if self._is_leader():
            await self._server_handle().sleep.remote()

    async def update_weights(self, weights, global_steps: Optional[int] = None, **kwargs):
        # Every rank must drain the generator: full_tensor() of a DTensor is a collective.
        state = {}
        for name, tensor in weights:
            state[name] = tensor.detach().to("cpu", copy=True).float()
        if self._is_leader():
            await self._server_handle().update_weights.remote(state, global_steps)
