"""One node's check before ``ray start`` (run by agent-grpo.sbatch with ``srun`` on every node): the Python
environment has the rollout engine and a CUDA torch, and this node's GPUs are visible. Fails in seconds, with
what to do, instead of after Ray, the env, the model download and FSDP init (``No module named 'sglang'``).

Prints one line ``gpu-check <node> ok gpus=<N> ...`` (the sbatch reads ``gpus=``), or the problem on stderr and
exits 3.
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys

FIX = (
    "the job's Python environment ({venv}) cannot run verl's GPU rollout. Either build the pinned GPU environment "
    "on the shared filesystem (`make venv-gpu VERL_LINE=0.9`, then AGENTRL_VENV=$AGENTRL_HOME/.venv-gpu-0.9) or "
    "run the job inside the trainer image with Apptainer or enroot/pyxis (docs/multi-node.md, 'GPU environment'). "
    "AGENTRL_GPU_CHECK=0 skips this check (CPU stand-ins only)."
)


def check(engine: str, gpus: int) -> tuple[int, str]:
    """``(visible GPUs, versions)``; raises ``RuntimeError`` with the problem."""
    versions = {}
    for module in ("torch", "verl", engine):
        try:
            versions[module] = getattr(importlib.import_module(module), "__version__", "?")
        except Exception as error:  # ImportError, or a CUDA library that fails to load
            raise RuntimeError(f"import {module} failed: {type(error).__name__}: {error}") from error
    import torch

    if torch.version.cuda is None:
        raise RuntimeError(f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)")
    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: "
                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}; was the job given "
                           "--gpus-per-node / --gres=gpu:N?")  # fmt: skip
    found = torch.cuda.device_count()
    if gpus and found < gpus:
        raise RuntimeError(f"{found} GPU(s) visible, the job asked for {gpus} per node")
    return found, " ".join(f"{k}={v}" for k, v in versions.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="sglang", help="the rollout engine's module (rollout.name)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs this node must show (0: at least one)")
    args = parser.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        found, versions = check(args.engine, args.gpus)
    except RuntimeError as error:
        print(f"gpu-check {node}: FAILED: {error}\n  {FIX.format(venv=sys.prefix)}", file=sys.stderr)
        return 3
    print(f"gpu-check {node} ok gpus={found} {versions}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
