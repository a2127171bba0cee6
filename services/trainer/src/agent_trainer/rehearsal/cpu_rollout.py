"""The rollout engine on CPU, in verl's own slots for sglang (``rollout.name: cpu``, ``mode: async``):

- ``CpuLLMServer`` (a Ray actor, one per replica), the role of verl's sglang server: ``generate(prompt_ids,
  sampling_params, request_id, ...) -> TokenOutput`` with ``extra_fields={"global_steps": N}`` as sglang's server
  reports it, the lifecycle calls verl makes (``wake_up``, ``sleep``, ``clear_kv_cache``, ``abort_all_requests``,
  ``resume_generation``, ``set_global_steps``, profiling) and ``update_weights``, the target of the weight sync;
- ``CpuReplica``: ``verl.workers.rollout.replica.RolloutReplica`` (``launch_servers``), registered in
  ``RolloutReplicaRegistry``; the agent-loop manager starts one per replica;
- ``CpuServerAdapter``: ``verl.workers.rollout.base.BaseRollout`` inside each FSDP worker of the hybrid engine
  (``resume``, ``release``, ``update_weights``), registered in ``_ROLLOUT_REGISTRY``; every rank drains the weight
  generator (gathering a sharded tensor is a collective), the replica's first rank pushes the weights.

Generation samples from the actor's own weights with the sampling parameters verl sends (temperature, top-k,
top-p, max tokens), one request at a time per replica.

For the rehearsal's checks (:mod:`.checks`, run in the trainer's process) each server also keeps a record of its
generations (``generations``: prompt digest and new tokens, the model's own tokens), reports every weight load
(``sync_report``: version, names missing or unknown against its own model) and scores a fixed sequence with the
weights it holds (``score``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from .checks import Generation, name_check, prompt_digest
from .generation import generate_tokens, score_tokens

NAME = "cpu"
#: The rollouts' sampling seed (each replica adds its rank), set by ``make learn SEED=...``.
SEED_ENV = "AGENTRL_ROLLOUT_SEED"
SERVER_NAME = "agentrl_cpu_rollout_{replica}"


def register() -> None:
    """``rollout.name: cpu`` in verl's two rollout registries."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.CpuServerAdapter"
    RolloutReplicaRegistry.register(NAME, lambda: CpuReplica)


class CpuLLMServer:
    """Token-in, token-out generation with a Hugging Face causal LM on CPU; weights replaced at every sync."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int, seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        torch.set_num_threads(1)
        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        path = self.model_config.local_path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="sdpa", dtype=torch.float32
        )
        self.model.eval()
        self.replica_rank = replica_rank
        seed = seed or int(os.environ.get(SEED_ENV, "0"))  # make learn's SEED: the rollouts' sampling
        self.generator = torch.Generator().manual_seed(seed + replica_rank)
        self.global_steps: int | None = None
        self.weight_version = 0
        self.calls = 0
        self._lock = threading.Lock()
        self._generations: list[Generation] = []
        self._sync: dict[str, Any] = {
            "version": 0,
            "global_steps": None,
            "tensors": 0,
            "missing": [],
            "unknown": [],
        }
        self.eos_ids = {self.tokenizer.eos_token_id}
        generation = self.model_config.generation_config
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        self.eos_ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    def get_server_address(self) -> tuple[str, int]:
        return f"cpu-rollout-{self.replica_rank}", 0

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> TokenOutput:  # fmt: skip
        params = dict(sampling_params)
        loop = asyncio.get_running_loop()
        token_ids, log_probs, finished = await loop.run_in_executor(
            None, self._generate, list(prompt_ids), params
        )
        return TokenOutput(token_ids=token_ids, log_probs=log_probs if params.get("logprobs") else None,
                           stop_reason="completed" if finished else "length",
                           extra_fields={"global_steps": self.global_steps})  # fmt: skip

    def _generate(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[float], bool]:
        room = self.config.prompt_length + self.config.response_length - len(prompt_ids)
        limit = params.get("max_new_tokens", params.get("max_tokens"))
        limit = max(0, min(self.config.response_length if limit is None else int(limit), room))
        with self._lock:
            self.calls += 1
            produced = generate_tokens(self.model, prompt_ids, limit, temperature=float(params.get("temperature") or 0.0),
                                       top_k=int(params.get("top_k") or -1), top_p=float(params.get("top_p") or 1.0),
                                       generator=self.generator, eos_ids=self.eos_ids)  # fmt: skip
            self._generations.append(
                Generation(len(prompt_ids), prompt_digest(prompt_ids), tuple(produced[0]))
            )
            return produced

    def generations(self, start: int = 0) -> tuple[list[Generation], int]:
        """The generations from the ``start``-th on, and the next cursor (the checks fetch each step's)."""
        with self._lock:
            return self._generations[start:], len(self._generations)

    def sync_report(self) -> dict[str, Any]:
        """The last weight load: version (loads so far), global step, tensors, names missing and unknown."""
        return dict(self._sync)

    def score(self, prompt_ids: list[int], response_ids: list[int], temperature: float) -> list[float]:
        """Log-probabilities of ``response_ids`` after ``prompt_ids`` under the weights this server holds."""
        with self._lock:
            return score_tokens(self.model, prompt_ids, response_ids, temperature)

    def update_weights(
        self, state: dict[str, torch.Tensor], global_steps: int | None = None
    ) -> dict[str, Any]:
        """Load the actor's weights (the weight sync). Every pushed name must be one of the model's and every
        tensor of the model must be pushed (or tied to a pushed one): what is not is recorded in
        :meth:`sync_report` (the trainer-side check fails the sync) and the rest is loaded. Returns the report."""
        own = self.model.state_dict()
        names = name_check(own, state)
        with self._lock:
            self.model.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        self._sync = {
            "version": self.weight_version,
            "global_steps": global_steps,
            "tensors": len(state),
            **names,
        }
        checksum = float(sum(float(v.double().sum()) for v in state.values()))
        print(f"[rehearsal] rollout replica {self.replica_rank}: weights v{self.weight_version} "
              f"(global step {global_steps}, {len(state)} tensors, missing {names['missing'][:3]}, "
              f"unknown {names['unknown'][:3]}) checksum={checksum:.6f}", flush=True)  # fmt: skip
        return {**self._sync, "checksum": checksum}

    async def wake_up(self) -> None:
        pass

    async def sleep(self) -> None:
        pass

    async def clear_kv_cache(self) -> None:
        pass

    async def release_kv_cache(self) -> None:
        pass

    async def resume_kv_cache(self) -> None:
        pass

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        pass

    async def resume_generation(self) -> None:
        pass

    async def start_profile(self, **kwargs: Any) -> None:
        pass

    async def stop_profile(self) -> None:
        pass


class CpuReplica(RolloutReplica):
    """One :class:`CpuLLMServer` per replica; the replica's FSDP workers push the actor's weights to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CpuLLMServer)

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        server = self.server_class.options(
            name=SERVER_NAME.format(replica=self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)  # fmt: skip
        self.servers = [server]
        address, port = await server.get_server_address.remote()
        self._server_handle = server
        self._server_address = f"{address}:{port}" if port else address


class CpuServerAdapter(BaseRollout):
    """The hybrid engine's side of the rollout, inside each FSDP worker (as verl's sglang ``ServerAdapter``)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        per_replica = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        self.replica_rank = rank // per_replica if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % per_replica
        self._server: Any = None

    def _leads(self) -> bool:
        if self.device_mesh is None:
            return self.rollout_rank == 0
        return self.device_mesh["infer_tp"].get_local_rank() == 0

    def _handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(SERVER_NAME.format(replica=self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        if self._leads():
            await self._handle().wake_up.remote()

    async def release(self) -> None:
        if self._leads():
            await self._handle().sleep.remote()

    async def update_weights(self, weights: Any, global_steps: int | None = None, **kwargs: Any) -> None:
        state = {name: tensor.detach().to("cpu", copy=True).float() for name, tensor in weights}
        if self._leads():
            await self._handle().update_weights.remote(state, global_steps)
