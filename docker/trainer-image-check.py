"""Build-time checks of the trainer image (docker/trainer.Dockerfile runs this; no GPU needed).

    python3 trainer-image-check.py --configs DIR [--accepted-conflicts FILE --pip-check-output FILE [--baseline F]]
                                   [--verl-line 0.7|0.9] [--require-driver] [--skip M ...]

1. Imports every module a GPU run imports: the verl entry point and its FSDP workers, the agent loop, the sglang
   server (verl's async sglang server and sglang's own launch_server, which eval runs), Ray, Ray Serve and the
   env's Serve app (AGENTRL_ENV=ray: agent-envs[ray] on the training cluster; its fastapi/starlette must suit
   the image's Ray), the merger, the WebShop trainer modules, TensorBoard's writer. flash_attn is required when a
   training config asks for it (attn_implementation flash_attention_2, verl's default, or use_remove_padding,
   which imports flash_attn.bert_padding), as each config composes (its environment's file over its base). A
   missing or broken module fails the build, not the first GPU hour.
   Ray Serve is also put through what it does when it deploys, short of a cluster: a deployment config to
   protobuf and back (Ray 2.49's Serve imports under protobuf 7 but cannot deploy anything).
2. Reads `pip check`'s output and fails on any conflict that is not listed, with its reason, in the accepted
   conflicts file (one regular expression per line, then ` # ` and the reason). With --baseline FILE (the
   base image's own `pip check`, taken before anything was installed), a conflict the base image already
   shipped is reported but accepted: only conflicts this build introduces fail it.
3. `docker build` runs without the NVIDIA driver (the container runtime mounts libcuda.so only into running
   containers). A module whose import fails only for want of the driver library is reported as deferred, and
   the trainer job runs this script again with --require-driver at its start, before the preflight, where any
   import failure fails the job within seconds.

--verl-line picks the module list (0.7: FSDP workers and the interaction; 0.9: the engine workers, TransferQueue
and the agent loop); default: the installed verl's line. --skip leaves a module out (default: the image's
AGENTRL_IMAGE_CHECK_SKIP, set from the build argument IMAGE_CHECK_SKIP): say why in the build log.

--device cpu (default: $AGENTRL_DEVICE, which the images set from their build argument TRAINER_DEVICE) is the
CPU build (make train-test|eval DEVICE=cpu): the GPU engine's modules (sglang, verl's sglang server, flash_attn)
are not there, and the CPU stand-ins that replace them are imported instead (the rollout server, the eval chat
server, verl's CPU device seams): the same list otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback
from pathlib import Path

_COMMON_MODULES = (
    "torch",
    "ray",
    # AGENTRL_ENV=ray: the env as a Ray Serve app on this cluster (`agent-envs serve-ray`); a Serve whose web stack
    # does not fit the image's Ray fails here, not when the first replica starts
    "ray.serve",
    "agent_envs.ray_serve.app",
    "transformers",
    "verl.trainer.main_ppo",
    "verl.experimental.agent_loop.tool_agent_loop",
    "verl.experimental.reward_loop.reward_loop",
    "verl.model_merger.fsdp_model_merger",
    "verl.workers.rollout.sglang_rollout.async_sglang_server",
    "sglang",
    "sglang.launch_server",
    "torch.utils.tensorboard",
    "agent_envs.client",
    "agent_trainer.agent_loop",
    "agent_trainer.evaluation.policies",
    "agent_trainer.evaluation.model_path",
)
GPU_RUN_MODULES = {
    "0.7": (*_COMMON_MODULES, "verl.workers.fsdp_workers", "agent_trainer.verl_main",
            "agent_trainer.interaction", "agent_trainer.reward"),
    # verl 0.9: main_ppo's default v1 trainer (trainer.use_v1) imports TransferQueue; workers are engine workers
    "0.9": (*_COMMON_MODULES, "verl.workers.engine_workers", "verl.trainer.ppo.v1", "transfer_queue"),
}  # fmt: skip
#: The GPU engine: what the CPU build (--device cpu) lacks and replaces with :data:`CPU_STAND_INS`.
GPU_ENGINE_MODULES = (
    "verl.workers.rollout.sglang_rollout.async_sglang_server",
    "sglang",
    "sglang.launch_server",
)
#: What stands in for the GPU engine in the CPU build, per line (agent_trainer.rehearsal: the rollout engine,
#: the eval's chat server, verl's device seams on CPU).
CPU_STAND_INS = {
    "0.7": ("agent_trainer.rehearsal.cpu_rollout", "agent_trainer.rehearsal.chat_server",
            "agent_trainer.rehearsal.cpu_verl07"),
    "0.9": ("agent_trainer.rehearsal.cpu_rollout", "agent_trainer.rehearsal.chat_server",
            "agent_trainer.rehearsal.cpu_platform"),
}  # fmt: skip


def run_modules(line: str, device: str, flash_reasons: list[str], skip: list[str]) -> list[str]:
    """The modules a run of ``line`` on ``device`` imports: the GPU run's list, or on ``cpu`` that list with the GPU
    engine replaced by its CPU stand-ins (and no flash_attn: the CPU attention is PyTorch's SDPA)."""
    if device == "cpu":
        modules = [m for m in GPU_RUN_MODULES[line] if m not in GPU_ENGINE_MODULES] + list(
            CPU_STAND_INS[line]
        )
    else:
        modules = list(GPU_RUN_MODULES[line]) + list(FLASH_ATTN_MODULES if flash_reasons else ())
    return [m for m in modules if m not in skip]


# What `docker build` lacks and a GPU container has: the driver libraries the NVIDIA runtime mounts.
DRIVER_LIBRARIES = re.compile(r"lib(cuda|nvidia-ml)\.so")
FLASH_ATTN_MODULES = ("flash_attn", "flash_attn.bert_padding")


def configs_need_flash_attn(config_dir: Path) -> list[str]:
    """The training configs (``*_grpo_*.yaml``) that would import flash_attn on a GPU, and why: each as Hydra
    composes it (the environment's file over its base, ``base/grpo_{test,train}.yaml``; the project's files only,
    where a key none of them sets is verl's default: ``agent_trainer.config.load_training_config``)."""
    from omegaconf import OmegaConf

    from agent_trainer.config import load_training_config

    reasons: list[str] = []
    for config in sorted(config_dir.glob("*_grpo_*.yaml")):
        composed = load_training_config(config.stem, directory=config_dir, with_verl=False)
        model = OmegaConf.select(composed, "actor_rollout_ref.model") or {}
        attn = OmegaConf.select(composed, "actor_rollout_ref.model.override_config.attn_implementation")
        if model.get("use_remove_padding") is True:
            reasons.append(f"{config.name}: use_remove_padding true imports flash_attn.bert_padding")
        if attn is None or attn == "flash_attention_2":
            reasons.append(f"{config.name}: attention flash_attention_2 (verl's default when none is set)")
    return reasons


def installed_verl_line() -> str:
    """0.9 for verl >= 0.8 (no interactions), else 0.7; 0.7 where verl is missing (its import then fails)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("verl").split(".")[:2])
    except PackageNotFoundError:
        return "0.7"
    return "0.9" if (major, minor) >= (0, 8) else "0.7"


def _needs_driver(error: BaseException) -> bool:
    """Whether the import failed for want of a driver library: the error's own message, or that of the error it
    was raised from (``raise ... from``), names one. Not its source lines, nor an error it merely happened
    during (``__context__``): a real failure while handling a missing driver must still fail the build."""
    cause: BaseException | None = error
    while cause is not None:
        if DRIVER_LIBRARIES.search(str(cause)):
            return True
        cause = cause.__cause__
    return False


def import_errors(modules: tuple[str, ...] | list[str], deferred: list[str] | None = None) -> list[str]:
    """`import NAME: error` for each module that does not import. With ``deferred`` (a list to fill), a failure
    caused only by a missing NVIDIA driver library goes there instead (the build has no driver)."""
    errors = []
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as error:
            last = traceback.format_exception_only(type(error), error)[-1].strip()
            if deferred is not None and _needs_driver(error):
                deferred.append(f"import {name}: {last}")
            else:
                errors.append(f"import {name}: {last}")
    return errors


def serve_problems() -> list[str]:
    """Ray Serve's deploy path without a cluster: its controller reads every deployment's config from protobuf.
    Ray 2.49's Serve does that through ``FieldDescriptor.label``, which protobuf 7 removed (Ray 2.60 handles both):
    under protobuf 7 it imports, and fails when the env's app is deployed (`agent-envs serve-ray`)."""
    try:
        from ray.serve._private.config import DeploymentConfig

        config = DeploymentConfig(num_replicas=2, max_ongoing_requests=64)
        if DeploymentConfig.from_proto_bytes(config.to_proto_bytes()).num_replicas != 2:
            return ["ray.serve: a deployment config does not survive protobuf and back"]
    except Exception as error:
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        return [f"ray.serve: a deployment config does not go through protobuf and back: {last}"]
    return []


def read_accepted(path: Path) -> list[tuple[re.Pattern[str], str]]:
    accepted = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pattern, separator, reason = line.partition(" # ")
        if not separator or not reason.strip():
            raise SystemExit(f"{path}: every accepted conflict needs ' # <reason>': {line!r}")
        accepted.append((re.compile(pattern.strip()), reason.strip()))
    return accepted


def conflict_lines(pip_check_output: str) -> list[str]:
    lines = [line.strip() for line in pip_check_output.splitlines() if line.strip()]
    return [line for line in lines if not line.startswith("No broken requirements")]


def conflict_verdicts(
    pip_check_output: str, accepted: list[tuple[re.Pattern[str], str]], baseline: str = ""
) -> list[tuple[str, str | None]]:
    """(conflict, why it is accepted) for each line of `pip check` output; why is None for a conflict that no
    accepted pattern matches and the base image did not already report (``baseline``: its own output)."""
    shipped = set(conflict_lines(baseline))
    verdicts: list[tuple[str, str | None]] = []
    for line in conflict_lines(pip_check_output):
        reasons = [reason for pattern, reason in accepted if pattern.search(line)]
        verdicts.append((line, "shipped by the base image" if line in shipped else next(iter(reasons), None)))
    return verdicts


def unaccepted_conflicts(
    pip_check_output: str, accepted: list[tuple[re.Pattern[str], str]], baseline: str = ""
) -> list[str]:
    """The conflicts of `pip check` output that fail the build (``No broken requirements found.`` is none)."""
    return [line for line, why in conflict_verdicts(pip_check_output, accepted, baseline) if why is None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", type=Path, required=True)
    parser.add_argument("--accepted-conflicts", type=Path, default=None)
    parser.add_argument("--pip-check-output", type=Path, default=None)
    parser.add_argument("--baseline", type=Path, default=None, help="the base image's own `pip check` output")
    parser.add_argument("--verl-line", choices=sorted(GPU_RUN_MODULES), default=None)
    parser.add_argument("--require-driver", action="store_true",
                        help="at run time, in a GPU container: a missing driver library fails too")  # fmt: skip
    parser.add_argument("--skip", nargs="*", default=os.environ.get("AGENTRL_IMAGE_CHECK_SKIP", "").split(),
                        help="modules not to import (say why); default: $AGENTRL_IMAGE_CHECK_SKIP, which the images "
                        "set to their build's IMAGE_CHECK_SKIP so the job's rerun skips the same")  # fmt: skip
    parser.add_argument("--device", choices=("gpu", "cpu"),
                        default=os.environ.get("AGENTRL_DEVICE", "").strip().lower() or "gpu",
                        help="gpu (default) or cpu: the CPU build, whose stand-ins replace the GPU engine "
                        "(default: $AGENTRL_DEVICE)")  # fmt: skip
    args = parser.parse_args(argv)
    problems: list[str] = []
    line = args.verl_line or installed_verl_line()

    flash_reasons = configs_need_flash_attn(args.configs) if args.device == "gpu" else []
    modules = run_modules(line, args.device, flash_reasons, args.skip)
    for reason in flash_reasons:
        print(f"image check: flash_attn required: {reason}")
    if args.device == "cpu":
        print(
            f"image check: CPU build: {', '.join(GPU_ENGINE_MODULES)} replaced by {', '.join(CPU_STAND_INS[line])}"
        )
    deferred: list[str] = []
    problems += import_errors(modules, None if args.require_driver else deferred)
    imported = len(modules) - len(problems) - len(deferred)
    print(f"image check (verl {line} line, {args.device}): imported {imported}/{len(modules)} modules"
          + (f" (skipped: {', '.join(args.skip)})" if args.skip else ""))  # fmt: skip
    for item in deferred:
        print(
            f"image check: deferred to the job's start (needs the NVIDIA driver, absent at build time): {item}"
        )
    if "ray.serve" in modules and not any(
        item.startswith(("import ray:", "import ray.serve:")) for item in problems + deferred
    ):
        problems += serve_problems()

    if args.pip_check_output is not None:
        if args.accepted_conflicts is None:
            parser.error("--pip-check-output needs --accepted-conflicts")
        accepted = read_accepted(args.accepted_conflicts)
        baseline = args.baseline.read_text() if args.baseline else ""
        for conflict, why in conflict_verdicts(args.pip_check_output.read_text(), accepted, baseline):
            if why is None:
                problems.append(
                    f"pip check: {conflict} (not in {args.accepted_conflicts.name}, not shipped by the base image)"
                )
            else:
                print(f"image check: accepted conflict: {conflict}  ({why})")
    for problem in problems:
        print(f"image check FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
