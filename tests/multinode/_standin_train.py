"""A training stand-in for the Slurm preemption test: steps that take ``--step-s`` seconds each, a checkpoint after
every step in verl's layout and order (each rank's ``actor/model_world_size_W_rank_R.pt``, one at a time, then
``data.pt``, then ``latest_checkpointed_iteration.txt``), and resume as ``agent-train train`` resumes: the
launcher's :func:`repair_resume_point`, then verl's own ``find_latest_ckpt_path``. SIGTERM kills it wherever it
is (as it kills verl's ``main_ppo``), a checkpoint half written included.

    python _standin_train.py --checkpoints DIR --steps 6 --step-s 2
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

from agent_trainer.cli import TRACKER, repair_resume_point

RANKS = 2


def save(checkpoints: Path, step: int, save_s: float) -> None:
    folder = checkpoints / f"global_step_{step}"
    (folder / "actor").mkdir(parents=True, exist_ok=True)
    for rank in range(RANKS):
        (folder / "actor" / f"model_world_size_{RANKS}_rank_{rank}.pt").write_bytes(os.urandom(64))
        time.sleep(save_s / (RANKS + 1))  # a SIGTERM here leaves a half-written checkpoint
    (folder / "data.pt").write_bytes(b"dataloader")
    (checkpoints / TRACKER).write_text(str(step))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-s", type=float, default=2.0)
    args = parser.parse_args()
    args.checkpoints.mkdir(parents=True, exist_ok=True)
    repaired = repair_resume_point(args.checkpoints)
    if repaired:
        print(f"standin: {repaired}", flush=True)
    latest = find_latest_ckpt_path(str(args.checkpoints))
    start = int(latest.rsplit("_", 1)[-1]) if latest else 0
    print(f"standin: resumed from step {start}" if start else "standin: fresh start", flush=True)
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_s)
        print(f"standin: step {step} trained", flush=True)
        save(args.checkpoints, step, args.step_s)
        print(f"standin: step {step} saved", flush=True)
    print(f"standin: done at step {args.steps}", flush=True)


if __name__ == "__main__":
    main()
