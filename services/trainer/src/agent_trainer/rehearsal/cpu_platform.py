"""verl 0.9.1 on CPU: ``PlatformCPU`` in verl's platform registry (``verl.plugin.platform``), chosen with
``VERL_PLATFORM=cpu``. verl imports this module in every process at ``import verl`` time
(``VERL_USE_EXTERNAL_MODULES=agent_trainer.rehearsal.cpu_platform``), which also applies the torch seams a
platform cannot express (:mod:`.cpu_torch`). ``setup()`` (Ray's ``worker_process_setup_hook``, and the driver)
registers the rollout engine and verl's FSDP engines for device ``cpu``; it runs after ``import verl`` has
finished, since registering imports ``verl.workers``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from . import cpu_torch


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """The device side of verl 0.9.1 on CPU: gloo, :data:`cpu_torch.CPU_DEVICE`, Ray's ``GPU`` resources."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return cpu_torch.CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> str:
        # verl moves modules to get_device_id(): an int would name an accelerator
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # Ray still sets it for the (fake) GPU resources

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"  # the workers are scheduled on fake GPUs (ray.init(num_gpus=N)) and run on CPU

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_engines() -> None:
    """verl 0.9.1 keys its training engines by device and registers the FSDP ones for cuda and npu only."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    for model_type, engine in (("language_model", transformer_impl.FSDPEngineWithLMHead),
                               ("value_model", transformer_impl.FSDPEngineWithValueHead)):  # fmt: skip
        for backend in ("fsdp", "fsdp2"):
            EngineRegistry._engines.setdefault(model_type, {}).setdefault(backend, {}).setdefault(
                "cpu", engine
            )


def setup() -> None:
    """The registrations, once per process (after ``import verl``)."""
    import verl  # noqa: F401  (loads this module as a platform plugin first, where it is configured)

    from . import setup_process

    setup_process("0.9", register_engines)


cpu_torch.apply()
