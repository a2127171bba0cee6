"""``agent-train rehearse``: the training run a user starts with ``make train-test``, on CPU, through verl's own
trainer (``RayPPOTrainer.fit`` on 0.7.1, the v1 TransferQueue trainer on 0.9.1) on a real local Ray cluster,
against the real env cluster, with a tiny local model. Only what is inherently CUDA is substituted; each
substitution lives in one module here and is listed in ``SUBSTITUTED`` (and so in the run's summary).

- ``cpu_torch``: torch-level seams shared by both lines (gloo for verl's NCCL backend, FSDP2's pinned CPU
  offload, the ``torch.cuda`` memory API verl calls through its device module);
- ``cpu_verl07``: verl 0.7.1's device helpers and the rollout registration, installed in every Ray worker
  process by Ray's ``worker_process_setup_hook`` (0.7.1 has no platform registry);
- ``cpu_platform``: verl 0.9.1's ``PlatformCPU`` (``verl.plugin.platform`` registry, ``VERL_PLATFORM=cpu``,
  imported in every process through ``VERL_USE_EXTERNAL_MODULES``) and the FSDP engines registered for ``cpu``;
- ``cpu_rollout``: the rollout engine, a CPU server that generates with the actor's weights pushed at every sync;
- ``checks`` and ``direction``: what the rehearsal checks inside verl's trainer (loss mask, reward, update direction,
  weight sync; see docs/rehearsal.md), and ``inject``: the bugs a test puts in to see those checks fail;
- ``run``: the driver (data, tiny model, env cluster, the two invocations, merger, summary). Its scale-down of the
  test config (every Hydra override and setting, with the config's own value) is also listed in the summary.
"""

#: Each stand-in and the verl interface it fills (written into the rehearsal's summary).
SUBSTITUTED = (
    "device: CPU instead of CUDA; Ray schedules the FSDP workers on fake GPU resources "
    "(ray.init(num_gpus=N)), torch runs them on CPU (rehearsal.cpu_torch, rehearsal.cpu_verl07, "
    "rehearsal.cpu_platform)",
    "collectives: gloo instead of NCCL (torch.distributed.init_process_group backend; verl 0.9.1: "
    "PlatformBase.communication_backend_name)",
    "device module: torch.cpu plus no-op torch.cuda memory calls (verl.utils.device.get_torch_device; "
    "verl 0.9.1: PlatformBase.device_module)",
    "FSDP2 CPU offload without pinned memory (torch.distributed.fsdp.CPUOffloadPolicy(pin_memory=False))",
    "verl 0.9.1 platform: PlatformCPU registered in verl.plugin.platform.PlatformRegistry; FSDP engines "
    "registered for device cpu in verl.workers.engine.base.EngineRegistry",
    "rollout engine: CpuLLMServer (the role of sglang's server: generate -> TokenOutput, sleep/wake, "
    "set_global_steps, update_weights), CpuReplica (verl.workers.rollout.replica.RolloutReplica, registered "
    "in RolloutReplicaRegistry as 'cpu'), CpuServerAdapter (verl.workers.rollout.base.BaseRollout: resume, "
    "release, update_weights; registered in _ROLLOUT_REGISTRY)",
    "attention: PyTorch SDPA on CPU (the configs' attn_implementation: sdpa)",
    "verl 0.9.1: TransferQueue with 2 storage units instead of 8 (a Ray actor process each; "
    "transfer_queue.backend.SimpleStorage.num_data_storage_units)",
    "policy: a tiny local Qwen2-architecture model (2 layers, hidden 64, byte-level BPE tokenizer trained on the "
    "catalog) warm-started on the experts' episodes of the run's tasks (each environment's core's expert, WebShop's "
    "the catalog's oracle, rendered through the trainer's spec), instead of Qwen/Qwen2.5-1.5B-Instruct",
    "eval server: agent_trainer.rehearsal.chat_server (the same CPU generation) instead of sglang "
    "(agent-train eval --server cpu)",
)


_SET_UP = False


def setup_process(line: str, *seams: object) -> None:
    """What every process of a rehearsal run needs, once (Ray's ``worker_process_setup_hook`` and the driver):
    one intra-op thread, the torch seams, the line's own ``seams`` (callables), the rollout engine ``cpu``, the
    trainer-side checks when asked for, and the bugs a test injects (``$AGENTRL_REHEARSAL_INJECT``)."""
    import os

    global _SET_UP
    if _SET_UP:
        return
    _SET_UP = True
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from . import cpu_torch
    from .cpu_rollout import register
    from .direction import install
    from .inject import apply

    cpu_torch.apply()
    for seam in seams:
        seam()  # type: ignore[operator]
    register()
    install(line)
    apply()
