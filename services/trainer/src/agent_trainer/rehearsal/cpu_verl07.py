"""verl 0.7.1 on CPU: ``setup()`` runs in every Ray worker process (``runtime_env.worker_process_setup_hook``,
which ``run_ppo`` passes to ``ray.init``; 0.7.1 has no platform registry) and in the driver.

- ``verl.utils.device``: ``get_nccl_backend()`` -> ``gloo``; ``get_torch_device()`` -> :data:`cpu_torch.CPU_DEVICE`
  (also where loaded verl modules imported those names);
- the rollout engine ``cpu`` (:func:`.cpu_rollout.register`).
"""

from __future__ import annotations

import sys

from . import cpu_torch


def patch_device_helpers() -> None:
    import verl.utils.device as device

    originals = {"get_nccl_backend": device.get_nccl_backend, "get_torch_device": device.get_torch_device}
    patched = {"get_nccl_backend": lambda: "gloo", "get_torch_device": lambda: cpu_torch.CPU_DEVICE}
    for name, function in patched.items():
        setattr(device, name, function)
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("verl"):
            continue
        for name, function in patched.items():
            if getattr(module, name, None) is originals[name]:
                setattr(module, name, function)


def setup() -> None:
    """Every seam, once per process."""
    from . import setup_process

    setup_process("0.7", patch_device_helpers)
