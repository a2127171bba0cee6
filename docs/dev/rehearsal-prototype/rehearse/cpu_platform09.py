"""verl 0.9.1 CPU platform plugin for `make rehearse` (prototype).

Loaded in every process that imports verl via ``VERL_USE_EXTERNAL_MODULES=rehearse.cpu_platform09``
(verl/__init__.py:49-52) and selected with ``VERL_PLATFORM=cpu`` (plugin/platform/platform_manager.py:92).
Registers ``PlatformCPU`` in ``verl.plugin.platform.PlatformRegistry`` and applies the torch-level patches that a
platform cannot express (gloo backend string, FSDP2 pinned CPU offload). The rollout registrations are done
lazily by ``rehearse.cpu_patch.setup`` (Ray worker_process_setup_hook) to avoid importing verl.workers while
verl/__init__ is still executing.
"""

from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import Any, Optional

import torch

from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


class _CpuDeviceModule(ModuleType):
    """torch.cpu plus the torch.cuda memory API verl calls through get_torch_device() (no-ops on CPU)."""

    def __init__(self):
        super().__init__("rehearse_cpu_device")

    def __getattr__(self, name):
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in ("get_rng_state", "set_rng_state", "manual_seed", "initial_seed", "seed"):
            return getattr(torch, name)
        if name == "manual_seed_all":
            return torch.manual_seed
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

            return types.SimpleNamespace(_set_allocator_settings=lambda *a, **k: None)
        return lambda *a, **k: 0


CPU_DEVICE = _CpuDeviceModule()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return True

    def current_device(self):
        # torch.cpu.current_device() is the string "cpu"; verl does model.to(device=get_device_id())
        # (utils/fsdp_utils.py:507), where an int would mean an accelerator index.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: Optional[int] = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray still schedules the workers on (fake) "GPU" resources and sets this variable.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        # Fake GPUs (ray.init(num_gpus=N)): verl's resource pools and their availability check ask for "GPU".
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _apply_torch_patches() -> None:
    from rehearse.cpu_patch import _patch_cpu_offload_policy, _patch_init_process_group

    _patch_init_process_group()
    _patch_cpu_offload_policy()


_apply_torch_patches()
