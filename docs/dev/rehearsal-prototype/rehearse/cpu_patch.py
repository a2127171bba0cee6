"""CPU patches for verl 0.7.1's trainer, applied in EVERY Ray worker process.

Installed as Ray's ``runtime_env.worker_process_setup_hook`` (``rehearse.cpu_patch.setup``) through
``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rehearse.cpu_patch.setup``; also call ``setup()`` in the
driver.  Idempotent.
"""

from __future__ import annotations

import os

ROLLOUT_NAME = "cpu"
_DONE = False


def _patch_init_process_group() -> None:
    """verl builds ``backend=f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"`` (fsdp_workers.py:159),
    which on a CPU-only torch is ``cpu:gloo,cpu:nccl`` -> ValueError "Duplicate device type cpu".
    Any backend that mentions nccl (or names the cpu device twice) becomes plain ``gloo``."""
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_rehearse", False):
        return

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend")
        if args:
            backend = args[0]
        if isinstance(backend, str) and ("nccl" in backend or backend.count("cpu:") > 1 or "hccl" in backend):
            backend = "gloo"
            if args:
                args = (backend,) + tuple(args[1:])
            else:
                kwargs["backend"] = backend
        return original(*args, **kwargs)

    init_process_group._rehearse = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    import torch.distributed.distributed_c10d as c10d

    c10d.init_process_group = init_process_group


def _patch_cpu_offload_policy() -> None:
    """verl 0.7.1 fsdp_workers.py:625 always gives the FSDP2 *ref* model ``CPUOffloadPolicy(pin_memory=True)``
    (and :621/:1558 for offload_policy); pinning needs an accelerator ("Cannot access accelerator device when none
    is available", torch _fsdp_param.py:315). Force pin_memory=False. Must run before verl.utils.fsdp_utils is
    imported (it does ``from torch.distributed.fsdp import CPUOffloadPolicy``); patched there too if already loaded."""
    import sys

    import torch.distributed.fsdp as tfsdp

    base = tfsdp.CPUOffloadPolicy
    if getattr(base, "_rehearse", False):
        return

    class CPUOffloadPolicy(base):  # type: ignore[misc, valid-type]
        _rehearse = True

        def __init__(self, pin_memory: bool = False):
            super().__init__(pin_memory=False)

    tfsdp.CPUOffloadPolicy = CPUOffloadPolicy
    for name, module in list(sys.modules.items()):
        if module is not None and (name.startswith("verl") or name.startswith("torch.distributed")):
            if getattr(module, "CPUOffloadPolicy", None) is base:
                module.CPUOffloadPolicy = CPUOffloadPolicy


class _CpuDeviceModule:
    """What verl calls on ``get_torch_device()`` (torch.cuda API) that ``torch.cpu`` lacks: memory stats
    (memory_reserved, max_memory_allocated, mem_get_info, ...), empty_cache, ipc_collect, rng state, etc.
    Everything else is delegated to ``torch.cpu``; unknown names become no-ops returning 0."""

    def __getattr__(self, name):
        import torch

        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all", "initial_seed", "seed"):
            return getattr(torch, name if name != "manual_seed_all" else "manual_seed")
        if name == "mem_get_info":
            def mem_get_info(*a, **k):
                import psutil

                vm = psutil.virtual_memory()
                return vm.available, vm.total

            return mem_get_info
        if name == "get_device_name":
            return lambda *a, **k: "cpu"
        if name == "memory":
            import types

            return types.SimpleNamespace(_set_allocator_settings=lambda *a, **k: None,
                                         _record_memory_history=lambda *a, **k: None,
                                         _dump_snapshot=lambda *a, **k: None)
        return lambda *a, **k: 0


CPU_DEVICE = _CpuDeviceModule()


def _patch_device_utils() -> None:
    """verl.utils.device: get_nccl_backend() -> "gloo"; get_torch_device() -> a torch.cpu shim with the
    torch.cuda memory API as no-ops. Also rebinds names already imported by loaded verl modules."""
    import sys

    import verl.utils.device as device

    originals = {"get_nccl_backend": device.get_nccl_backend, "get_torch_device": device.get_torch_device}
    patched = {"get_nccl_backend": lambda: "gloo", "get_torch_device": lambda: CPU_DEVICE}
    for name, fn in patched.items():
        setattr(device, name, fn)
    for modname, module in list(sys.modules.items()):
        if not modname.startswith("verl") or module is None:
            continue
        for name, fn in patched.items():
            if getattr(module, name, None) is originals[name]:
                setattr(module, name, fn)


def _register_rollout() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "rehearse.cpu_rollout.CpuServerAdapter"

    def _load():
        from rehearse.cpu_rollout import CpuReplica

        return CpuReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load)


def setup() -> None:
    global _DONE
    if _DONE:
        return
    _DONE = True
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
    except Exception:
        pass
    _patch_init_process_group()
    _patch_cpu_offload_policy()
    _patch_device_utils()
    _register_rollout()


def setup09() -> None:
    """verl 0.9.1: device handling comes from the PlatformCPU plugin (VERL_PLATFORM=cpu,
    VERL_USE_EXTERNAL_MODULES=rehearse.cpu_platform09); only the rollout registrations are done here."""
    global _DONE
    if _DONE:
        return
    _DONE = True
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    import verl  # noqa: F401  (imports the platform plugin)

    _patch_init_process_group()
    _patch_cpu_offload_policy()
    _register_rollout()
    _register_fsdp_engine_for_cpu()


def _register_fsdp_engine_for_cpu() -> None:
    """verl 0.9.1 EngineRegistry is keyed by device (workers/engine/base.py:399-427); the FSDP engines are
    registered for cuda/npu only (workers/engine/fsdp/transformer_impl.py:1143,1594). Register them for cpu too.
    (Alternative without code: VERL_ENGINE_DEVICE=cuda, base.py:405-406.)"""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl as t

    for model_type, cls in (("language_model", t.FSDPEngineWithLMHead), ("value_model", t.FSDPEngineWithValueHead)):
        for backend in ("fsdp", "fsdp2"):
            EngineRegistry._engines.setdefault(model_type, {}).setdefault(backend, {}).setdefault("cpu", cls)
