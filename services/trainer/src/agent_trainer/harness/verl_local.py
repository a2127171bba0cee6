"""verl's real agent-loop worker on CPU, in this process: no GPU workers, no inference server, no Ray actors.

Each verl line's own default worker runs here, generating with a stand-in model server
(:mod:`.model_servers`):

- verl 0.7.1: ``LocalAgentLoopWorker`` (its ``AgentLoopWorker``, returning a ``DataProto``);
- verl 0.9.1: ``run_tq_rollouts``: its ``AgentLoopWorkerTQ`` (the class behind the Ray actor that
  ``AgentLoopManagerTQ`` starts for ``trainer.use_v1: true``, the default) with verl's own ``LLMServerClient``,
  writing every trajectory into a real TransferQueue on a local Ray, then the v1 trainer's replay buffer, GRPO
  advantage and per-step metric computation over those trajectories, as ``PPOTrainer.fit`` runs them each step.

The seams filled in-process:

- the LLM server manager: any stand-in model server;
- the reward-loop worker handle: verl's own ``RewardLoopWorker`` behind a shim whose ``.remote()`` is a
  coroutine. The data goes through a pickle round trip first, as it would through Ray;
- 0.9.1's load balancer actor (``LocalLoadBalancer``), which hands ``LLMServerClient`` the one server.

Everything else is verl's code: ``generate_sequences`` picks the agent loop by the row's ``agent_name``,
instantiates ``ToolAgentLoop`` per trajectory (which builds our interaction from the interaction config),
pads, scores through the configured reward function and assembles the output ``DataProto``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import pickle
import time
import uuid
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import collate_fn

from ..rehearsal.device import LOCAL_STORAGE_UNITS


class LocalRemote:
    """``handle.method.remote(...)`` in-process: the coroutine of an async method, else a finished future
    (awaitable, and harmless when the caller fires and forgets, as ``LLMServerClient`` does on release)."""

    def __init__(self, function: Any) -> None:
        self._function = function

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        result = self._function(*args, **kwargs)
        if inspect.isawaitable(result):
            return result
        future = asyncio.get_running_loop().create_future()
        future.set_result(result)
        return future


class LocalLoadBalancer:
    """Stands in for verl 0.9.1's ``GlobalRequestLoadBalancer`` actor handle, which ``LLMServerClient`` asks
    for a server per request: every request goes to ``server`` (one in-process rollout server)."""

    def __init__(self, server: Any) -> None:
        handle = SimpleNamespace(generate=LocalRemote(server.generate))
        self.require_acquire_fields = LocalRemote(lambda: [])
        self.require_release_fields = LocalRemote(lambda: [])
        self.acquire_server = LocalRemote(lambda request_id, **fields: ("local", handle))
        self.release_server = LocalRemote(lambda server_id, **fields: None)


class LocalRewardHandle:
    """Stands in for a Ray handle of ``RewardLoopWorker``: ``await handle.compute_score.remote(data)``."""

    def __init__(self, worker: RewardLoopWorker) -> None:
        self.worker = worker
        self.compute_score = LocalRemote(self._compute_score)

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


def step_metrics_v07(
    config: DictConfig, gen_batch: DataProto, output: DataProto, seconds: float
) -> dict[str, Any]:
    """verl 0.7.1's per-step bookkeeping of ``RayPPOTrainer.fit`` over one rollout's output, with its own
    functions in its order: the batch joined with the generation, the reward extracted (``extract_reward``),
    GRPO advantages (``compute_advantage``), then the step's metrics (``ray_trainer.compute_data_metrics``,
    which ``verl_main.install_step_metrics`` extends with each environment's keys, the timing, throughput and
    variance metrics). Raises what the trainer would raise."""
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.reward import extract_reward

    from ..verl_main import install_step_metrics

    install_step_metrics()
    batch = output
    if (
        "uid" not in batch.non_tensor_batch
    ):  # the trainer's batch carries it (same rows: repeated, interleaved)
        batch.non_tensor_batch["uid"] = gen_batch.non_tensor_batch["uid"]
    # the rows' environments, which name their step metrics (the trainer's batch carries them too)
    if "data_source" not in batch.non_tensor_batch and "data_source" in gen_batch.non_tensor_batch:
        batch.non_tensor_batch["data_source"] = gen_batch.non_tensor_batch["data_source"]
    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
    reward_tensor, extra = extract_reward(batch)
    batch.batch["token_level_scores"] = reward_tensor
    batch.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    algorithm = config.algorithm
    batch = ray_trainer.compute_advantage(batch, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma,
                                          lam=algorithm.lam, num_repeat=config.actor_rollout_ref.rollout.n,
                                          norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
                                          config=algorithm)  # fmt: skip
    timing = {"step": seconds, "gen": seconds}
    metrics: dict[str, Any] = {"training/global_step": 1, "training/epoch": 0}
    metrics.update(ray_trainer.compute_data_metrics(batch=batch, use_critic=False))
    metrics.update(ray_trainer.compute_timing_metrics(batch=batch, timing_raw=timing))
    metrics.update(ray_trainer.compute_throughout_metrics(batch=batch, timing_raw=timing, n_gpus=1))
    metrics.update(ray_trainer.compute_variance_proxy_metrics(batch=batch, gradient_norm=None))
    return {k: _plain(v) for k, v in metrics.items()}


def summarize_output(output: DataProto) -> dict[str, Any]:
    """Per-trajectory rewards and metrics from ``generate_sequences``' output."""
    has_scores = "rm_scores" in output.batch.keys()  # noqa: SIM118 - TensorDict has no `in`
    scores = output.batch["rm_scores"].sum(dim=-1).tolist() if has_scores else []
    keys = output.meta_info.get("reward_extra_keys", [])
    extras = {k: [float(x) for x in output.non_tensor_batch[k]] for k in keys if k in output.non_tensor_batch}
    turns = [int(x) for x in output.non_tensor_batch.get("__num_turns__", [])]
    return {"scores": [float(s) for s in scores], "extras": extras, "num_turns": turns}


# ---- verl 0.9.1: the v1 (TransferQueue) path ---------------------------------------------------------------


@contextlib.contextmanager
def local_transfer_queue(config: DictConfig) -> Iterator[None]:
    """A real TransferQueue (controller and storage units are Ray actors) on a small local Ray, as
    ``main_ppo`` starts it (``tq.init(config.transfer_queue)``, with ``LOCAL_STORAGE_UNITS`` storage units);
    both are shut down afterwards."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf, open_dict

    tq_config = copy.deepcopy(config.get("transfer_queue") or OmegaConf.create({}))
    with open_dict(tq_config):
        tq_config.backend.SimpleStorage.num_data_storage_units = LOCAL_STORAGE_UNITS
    started = not ray.is_initialized()
    if started:  # logical CPUs: each TransferQueue actor asks for one; nothing here is CPU-bound
        ray.init(num_cpus=LOCAL_STORAGE_UNITS + 2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=128 * 1024**2)  # fmt: skip
    try:
        tq.init(tq_config)
        yield
    finally:
        with contextlib.suppress(Exception):
            tq.close()
        if started:
            ray.shutdown()


async def run_tq_rollouts(config: DictConfig, samples: Sequence[dict[str, Any]], server: Any,
                          global_steps: int = 1) -> dict[str, Any]:  # fmt: skip
    """One training step's rollout and bookkeeping on verl 0.9.1's default (v1) path, in this process.

    ``samples`` (dataset items, one per prompt) go to ``AgentLoopWorkerTQ`` as the trainer submits them; its
    agent loops run ``rollout.n`` sessions each and put every trajectory into TransferQueue; the trainer's own
    replay buffer samples the step's batch, ``PPOTrainer._compute_advantage`` computes GRPO advantages and
    ``PPOTrainer._compute_metrics`` the step's metrics, which fail on trajectories verl cannot account for
    (e.g. without the weights versions). Needs :func:`local_transfer_queue`. Returns the trajectories (as
    ``summarize_output`` does), the worker class name, the step's metrics and any error of the metric step.
    """
    import transfer_queue as tq
    from omegaconf import open_dict
    from tensordict import TensorDict
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.utils import tensordict_utils as tu
    from verl.workers.rollout.llm_server import LLMServerClient

    config = copy.deepcopy(config)
    with open_dict(config):
        config.data.train_batch_size = len(samples)
    # the weights the rollout of step N runs on are version N - 1 (the trainer syncs them after each step)
    await server.set_global_steps(global_steps - 1)
    worker_cls = AgentLoopWorkerTQ.__ray_actor_class__  # the class the manager's Ray actors run
    worker = worker_cls(
        config, llm_client=LLMServerClient(config, load_balancer_handle=LocalLoadBalancer(server))
    )
    batch_dict = collate_fn(list(samples))
    batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in samples], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", global_steps)
    uids = list(batch["uid"])
    # what PPOTrainer._submit_batch_to_rollout does in sync mode, then the manager's dispatch to a worker
    tq.kv_batch_put(keys=uids, partition_id="train",
                    tags=[{"is_prompt": True, "status": "pending", "global_steps": global_steps} for _ in uids])  # fmt: skip
    started = time.monotonic()
    await worker.generate_sequences(batch)
    await asyncio.gather(*list(worker.background_tasks))
    generated = time.monotonic() - started

    listing = tq.kv_list("train").get("train", {})
    failed = [uid for uid in uids if listing.get(uid, {}).get("status") != "finished"]
    result: dict[str, Any] = {
        "agent_loop_worker": worker_cls.__name__,
        "step_metrics": {},
        "step_metrics_error": None,
    }
    keys = sorted(k for k, tag in listing.items() if tag.get("status") == "success")
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores", "num_turns", "extra_fields"]) \
        if keys else None  # fmt: skip
    scores = [float(row.sum()) for row in data["rm_scores"].unbind()] if data is not None else []
    extras = (
        [dict(field.get("reward_extra_info") or {}) for field in data["extra_fields"]]
        if data is not None
        else []
    )
    result.update(
        scores=scores,
        extras={k: [float(e[k]) for e in extras] for k in (extras[0] if extras else {})},
        num_turns=[int(x) for x in data["num_turns"]] if data is not None else [],
        tags=[listing[k] for k in keys],
    )
    if failed:
        result["step_metrics_error"] = (
            f"{len(failed)} of {len(uids)} prompts' agent loops failed (see the log)"
        )
        return result
    from ..verl_main import install_env_step_metrics_v1

    install_env_step_metrics_v1()  # what the project's task runner installs in the trainer's process
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    trainer.global_steps = global_steps
    # the GPU resource pool is the one thing not here: throughput is normalised per GPU
    trainer.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: 1)
    metrics: dict[str, Any] = {}
    try:
        meta, sample_metrics = trainer.replay_buffer.sample(global_steps=global_steps, partition_id="train",
                                                            batch_size=len(uids))  # fmt: skip
        metrics.update(sample_metrics)
        # the actor's old-log-prob pass (PPOTrainer._compute_old_log_prob) needs the FSDP workers: its stand-in
        # writes the log-probs the rollout server reported, what the actor computes for the same weights
        rollout = tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["rollout_log_probs"])
        if "rollout_log_probs" in rollout.keys():  # noqa: SIM118 - TensorDict has no `in`
            tq.kv_batch_put(keys=meta.keys, partition_id="train",
                            fields=TensorDict({"old_log_probs": rollout["rollout_log_probs"]}, batch_size=len(meta)))  # fmt: skip
        meta = trainer._compute_advantage(meta, metrics)
        trainer._compute_metrics(meta, metrics, {"step": generated, "gen": generated}, global_steps=global_steps,
                                 epoch=0)  # fmt: skip
    except Exception as error:  # what would end the training run at this step
        result["step_metrics_error"] = f"{type(error).__name__}: {error}"
    result["step_metrics"] = {k: _plain(v) for k, v in metrics.items()}
    return result


def _plain(value: Any) -> Any:
    """A metric value as a JSON-friendly number."""
    with contextlib.suppress(TypeError, ValueError):
        return float(value)
    return str(value)
