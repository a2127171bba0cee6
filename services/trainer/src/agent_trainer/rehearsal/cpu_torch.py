"""Torch-level seams for verl on CPU, shared by both verl lines. Idempotent; imported in every process that runs
verl code (the driver, Ray's task runner and workers).

- verl asks ``torch.distributed`` for NCCL (0.7.1 builds ``cpu:gloo,cpu:nccl`` on a CPU torch, which torch rejects
  as a duplicate device type): any backend naming nccl becomes ``gloo``.
- verl gives the FSDP2 reference model ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator, so the
  policy is built with ``pin_memory=False``.
- ``CPU_DEVICE``: what verl calls on its device module (the ``torch.cuda`` API): ``torch.cpu``, plus the memory
  and cache calls as no-ops (``memory_reserved``, ``empty_cache``...), ``mem_get_info`` from the host's memory.
"""

from __future__ import annotations

import sys
import types
from types import ModuleType
from typing import Any

import torch

_RNG = ("get_rng_state", "set_rng_state", "manual_seed", "initial_seed", "seed")


class CpuDeviceModule(ModuleType):
    """``torch.cpu`` with the rest of the ``torch.cuda`` API verl calls as no-ops."""

    def __init__(self) -> None:
        super().__init__("agentrl_rehearsal_cpu_device")

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in _RNG:
            return getattr(torch, name)
        if name == "manual_seed_all":
            return torch.manual_seed
        if name == "mem_get_info":
            return _mem_get_info
        if name == "get_device_name":
            return lambda *args, **kwargs: "cpu"
        if name == "memory":
            return types.SimpleNamespace(
                _set_allocator_settings=_nothing, _record_memory_history=_nothing, _dump_snapshot=_nothing
            )
        return _zero


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
    import psutil

    memory = psutil.virtual_memory()
    return memory.available, memory.total


CPU_DEVICE = CpuDeviceModule()


def patch_process_group_backend() -> None:
    """``init_process_group(backend=<anything naming nccl>)`` -> ``gloo``."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = dist.init_process_group
    if getattr(original, "agentrl_rehearsal", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = args[0] if args else kwargs.get("backend")
        if isinstance(backend, str) and ("nccl" in backend or backend.count("cpu:") > 1):
            if args:
                args = ("gloo", *args[1:])
            else:
                kwargs["backend"] = "gloo"
        return original(*args, **kwargs)

    init_process_group.agentrl_rehearsal = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group


def patch_cpu_offload_policy() -> None:
    """``CPUOffloadPolicy`` without pinned memory, also where verl's modules already imported the name."""
    import torch.distributed.fsdp as fsdp

    base = fsdp.CPUOffloadPolicy
    if getattr(base, "agentrl_rehearsal", False):
        return

    class CPUOffloadPolicy(base):  # type: ignore[misc, valid-type]
        agentrl_rehearsal = True

        def __init__(self, pin_memory: bool = False) -> None:
            super().__init__(pin_memory=False)

    fsdp.CPUOffloadPolicy = CPUOffloadPolicy
    for name, module in list(sys.modules.items()):
        named = module is not None and name.startswith(("verl", "torch.distributed"))
        if named and getattr(module, "CPUOffloadPolicy", None) is base:
            module.CPUOffloadPolicy = CPUOffloadPolicy


def apply() -> None:
    """Both seams, and one intra-op thread per process (many Ray processes share two cores)."""
    torch.set_num_threads(1)
    patch_process_group_backend()
    patch_cpu_offload_policy()
