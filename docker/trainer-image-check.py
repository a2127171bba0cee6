"""Build-time checks of the trainer image (docker/trainer.Dockerfile runs this; no GPU needed).

    python3 trainer-image-check.py --configs DIR --accepted-conflicts FILE [--pip-check-output FILE] [--skip M ...]

1. Imports every module a GPU run imports: the verl entry point and its FSDP workers, the agent loop, the sglang
   server (verl's async sglang server and sglang's own launch_server, which eval runs), Ray, the merger, the
   WebShop trainer modules, TensorBoard's writer. flash_attn is required when a training config asks for it
   (attn_implementation flash_attention_2, verl's default, or use_remove_padding, which imports
   flash_attn.bert_padding). A missing or broken module fails the build, not the first GPU hour.
2. Reads `pip check`'s output and fails on any conflict that is not listed, with its reason, in the accepted
   conflicts file (one regular expression per line, then ` # ` and the reason).

--skip leaves a module out (a base image where one cannot be imported without a GPU): say why in the build log.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import traceback
from pathlib import Path

GPU_RUN_MODULES = (
    "torch",
    "ray",
    "transformers",
    "verl.trainer.main_ppo",
    "verl.workers.fsdp_workers",
    "verl.experimental.agent_loop.tool_agent_loop",
    "verl.experimental.reward_loop.reward_loop",
    "verl.model_merger.fsdp_model_merger",
    "verl.workers.rollout.sglang_rollout.async_sglang_server",
    "sglang",
    "sglang.launch_server",
    "torch.utils.tensorboard",
    "webshop_env.client",
    "webshop_trainer.verl_main",
    "webshop_trainer.interaction",
    "webshop_trainer.reward",
    "webshop_trainer.evaluation.policies",
    "webshop_trainer.evaluation.model_path",
)
FLASH_ATTN_MODULES = ("flash_attn", "flash_attn.bert_padding")


def configs_need_flash_attn(config_dir: Path) -> list[str]:
    """The training configs (webshop_grpo_*.yaml) that would import flash_attn on a GPU, and why."""
    reasons: list[str] = []
    for config in sorted(config_dir.glob("webshop_grpo_*.yaml")):
        text = config.read_text()
        remove_padding = re.search(r"^\s*use_remove_padding:\s*true\b", text, re.MULTILINE)
        attn = re.search(r"^\s*attn_implementation:\s*(\S+)", text, re.MULTILINE)
        if remove_padding:
            reasons.append(f"{config.name}: use_remove_padding true imports flash_attn.bert_padding")
        if attn is None or attn.group(1).strip("'\"") == "flash_attention_2":
            reasons.append(f"{config.name}: attention flash_attention_2 (verl's default when none is set)")
    return reasons


def import_errors(modules: tuple[str, ...] | list[str]) -> list[str]:
    errors = []
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as error:
            last = traceback.format_exception_only(type(error), error)[-1].strip()
            errors.append(f"import {name}: {last}")
    return errors


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


def unaccepted_conflicts(pip_check_output: str, accepted: list[tuple[re.Pattern[str], str]]) -> list[str]:
    """Lines of `pip check` output that no accepted pattern matches (``No broken requirements found.`` is none)."""
    lines = [line.strip() for line in pip_check_output.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("No broken requirements")]
    return [line for line in lines if not any(pattern.search(line) for pattern, _ in accepted)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", type=Path, required=True)
    parser.add_argument("--accepted-conflicts", type=Path, required=True)
    parser.add_argument("--pip-check-output", type=Path, default=None)
    parser.add_argument("--skip", nargs="*", default=[], help="modules not to import (say why)")
    args = parser.parse_args(argv)
    problems: list[str] = []

    flash_reasons = configs_need_flash_attn(args.configs)
    modules = [
        m for m in GPU_RUN_MODULES + (FLASH_ATTN_MODULES if flash_reasons else ()) if m not in args.skip
    ]
    for reason in flash_reasons:
        print(f"image check: flash_attn required: {reason}")
    problems += import_errors(modules)
    print(f"image check: imported {len(modules) - len(problems)}/{len(modules)} modules"
          + (f" (skipped: {', '.join(args.skip)})" if args.skip else ""))  # fmt: skip

    if args.pip_check_output is not None:
        accepted = read_accepted(args.accepted_conflicts)
        output = args.pip_check_output.read_text()
        for line in output.splitlines():
            for pattern, reason in accepted:
                if line.strip() and pattern.search(line):
                    print(f"image check: accepted conflict: {line.strip()}  ({reason})")
                    break
        problems += [f"pip check: {line} (not in {args.accepted_conflicts.name})"
                     for line in unaccepted_conflicts(output, accepted)]  # fmt: skip
    for problem in problems:
        print(f"image check FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
