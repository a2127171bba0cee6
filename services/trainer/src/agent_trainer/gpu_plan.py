"""The GPU count of a training run, from ONE setting (``GPU_IDS``), checked on the host before any image is
built or pulled: ``python3 services/trainer/src/agent_trainer/gpu_plan.py --config test|full|<name>`` (``<name>``:
a config of ``--config-dir``, e.g. ``textcraft_grpo_test``).

Standard library only (the host needs no venv, no Hydra, no verl). It reads the knobs the configs take from the
environment (``${oc.env:NAME,default}``) with their defaults from the YAML itself: the config's file and the
files its Hydra ``defaults:`` list names in the config directory (its base, ``base/grpo_{test,train}.yaml``), each
knob from the file Hydra lets win (:func:`config_files`; a test keeps this equal to the composed config). Then
the settings from ``.env`` and the process environment (the process wins, as in compose), and checks:

- ``GPU_IDS`` is a list of distinct device numbers, each one listed by ``nvidia-smi -L`` when given;
- ``AGENTRL_N_GPUS``, if set, equals the number of ids (compose hands exactly those devices to the container);
- verl's rules that depend on the GPU count: the rollout's tensor parallel size divides it, and
  ``train_batch_size * rollout.n`` is divisible by it.

Prints the GPU count on success (``make`` passes it on as ``AGENTRL_N_GPUS``) and, with ``--compose-override``,
writes the compose file that hands exactly those devices to the GPU services; exits 2 with the reasons and the
fix otherwise. ``--config eval`` checks only the ids. ``agent-train preflight`` checks the same rules on the composed config; tests keep both equal.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

CONFIG_FILES = {"test": "webshop_grpo_test.yaml", "full": "webshop_grpo_train.yaml"}
_CONFIG_NAME = re.compile(r"[a-z0-9]+(_[a-z0-9]+)*")


def config_file(config: str, config_dir: Path) -> Path:
    """``test``/``full`` (WebShop's runs) or a config's own name (``textcraft_grpo_test``, ``mixed_grpo_train``):
    its file in ``config_dir``; raises ValueError naming the configs there when there is none."""
    path = config_dir / (CONFIG_FILES.get(config) or f"{config}.yaml")
    if not _CONFIG_NAME.fullmatch(config) or not path.is_file():
        known = sorted(p.stem for p in config_dir.glob("*_grpo_*.yaml"))
        raise ValueError(
            f"no training config {config!r} in {config_dir}: test, full or one of {', '.join(known)}"
        )
    return path


# config key (last part) -> the environment variable the configs read it from
KNOBS = {
    "n_gpus_per_node": "AGENTRL_N_GPUS",
    "tensor_model_parallel_size": "AGENTRL_ROLLOUT_TP",
    "train_batch_size": "AGENTRL_TRAIN_BATCH_SIZE",
    "n": "AGENTRL_ROLLOUT_N",
}
_ENV_LOOKUP = re.compile(r"\$\{oc\.env:(\w+),([^}]*)\}")


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a compose ``.env`` file (no expansion; quotes stripped)."""
    values: dict[str, str] = {}
    if not path.exists():
        return values
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip().strip("'\"")
    return values


def settings_from(env_file: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The settings as compose resolves them: the environment over ``env_file``; a setting's new name
    (``AGENTRL_X``) over its old one (``WEBSHOP_X``, an ``.env`` or shell from before the rename), as in
    ``compose.yaml``'s ``${AGENTRL_X:-${WEBSHOP_X:-default}}`` (``agent_envs.setting_aliases`` has the rule; these
    standard-library checks read only settings that are not WebShop's own)."""
    merged = {**read_env_file(env_file), **{k: v for k, v in environ.items() if v}}
    for old, value in list(merged.items()):
        if old.startswith("WEBSHOP_") and value:
            merged.setdefault("AGENTRL_" + old[len("WEBSHOP_") :], value)
    return merged


_DEFAULTS_LIST = re.compile(r"^defaults:[ \t]*\n((?:[ \t]+-[^\n]*\n?)+)", re.MULTILINE)


def config_files(config_file: Path, root: Path | None = None) -> list[Path]:
    """``config_file`` and the files of its Hydra defaults list that are in the config directory ``root`` (default:
    the file's own), recursively, the one that wins first: a file's own values (``_self_``, last unless listed
    earlier) over its defaults, a later default over an earlier one. Entries are relative to the file's folder, or to
    ``root`` with a leading ``/``; those found elsewhere (verl's ``ppo_trainer``) are not files here and are skipped."""
    root = root or config_file.parent
    match = _DEFAULTS_LIST.search(config_file.read_text())
    entries = [line.strip()[1:].strip() for line in match.group(1).splitlines()] if match else []
    if "_self_" not in entries:
        entries.append("_self_")
    merged: list[Path] = []  # in Hydra's merge order: each one overrides those before it
    for entry in entries:
        if entry == "_self_":
            merged.append(config_file)
            continue
        name = entry.split("@", 1)[0].strip()
        path = root / f"{name[1:]}.yaml" if name.startswith("/") else config_file.parent / f"{name}.yaml"
        if path.is_file():
            merged.extend(reversed(config_files(path, root)))
    return list(reversed(merged))


def config_defaults(config_file: Path) -> dict[str, int]:
    """The default of every knob in :data:`KNOBS`, as written in the ``oc.env`` lookups of the config's file and its
    base (:func:`config_files`: the file that wins names it first)."""
    defaults: dict[str, int] = {}
    for path in config_files(config_file):
        for match in _ENV_LOOKUP.finditer(path.read_text()):
            name, default = match.group(1), match.group(2)
            if name in KNOBS.values() and name not in defaults:
                defaults[name] = int(default)
    missing = sorted(set(KNOBS.values()) - set(defaults))
    if missing:
        raise ValueError(f"{config_file}: no oc.env lookup with a default for {', '.join(missing)}")
    return defaults


def parse_gpu_ids(text: str) -> list[str]:
    """``"0,1, 3"`` -> ``["0", "1", "3"]``; raises ValueError on anything else."""
    ids = [part.strip() for part in text.split(",")] if text.strip() else []
    if not ids or any(not part.isdigit() for part in ids):
        raise ValueError(f"GPU_IDS must be comma-separated device numbers, e.g. 0 or 0,1,2,3 (got {text!r})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"GPU_IDS lists a device twice: {text!r}")
    return ids


def plan_errors(
    config: str, settings: Mapping[str, str], config_dir: Path, visible: int | None = None
) -> tuple[int, list[str]]:
    """``(gpu count, problems)`` for a run of ``config`` with ``settings`` (.env + environment)."""
    errors: list[str] = []
    try:
        ids = parse_gpu_ids(settings.get("GPU_IDS") or "0")
    except ValueError as error:
        return 0, [str(error)]
    count = len(ids)
    if visible is not None:
        unknown = [i for i in ids if int(i) >= visible]
        if unknown:
            errors.append(
                f"GPU_IDS names device(s) {', '.join(unknown)}, but nvidia-smi lists {visible} GPU(s)"
            )
    if config == "eval":  # sglang serves on the GPUs it is given; only the ids themselves matter
        return count, errors
    try:
        path = config_file(config, config_dir)
    except ValueError as error:
        return count, [str(error)]
    values = dict(config_defaults(path))
    for name in KNOBS.values():
        if settings.get(name):
            try:
                values[name] = int(settings[name])
            except ValueError:
                errors.append(f"{name}={settings[name]!r} is not a whole number")
    if settings.get("AGENTRL_N_GPUS") and values["AGENTRL_N_GPUS"] != count:
        errors.append(
            f"AGENTRL_N_GPUS={values['AGENTRL_N_GPUS']} but GPU_IDS={settings.get('GPU_IDS') or '0'} hands "
            f"{count} GPU(s) to the container: leave AGENTRL_N_GPUS empty (it is the number of GPU_IDS)"
        )
    tp = values["AGENTRL_ROLLOUT_TP"]
    if count % tp:
        errors.append(
            f"the {config} config's rollout tensor parallel size {tp} (AGENTRL_ROLLOUT_TP) does not divide the "
            f"{count} GPU(s) of GPU_IDS"
        )
    rollouts = values["AGENTRL_TRAIN_BATCH_SIZE"] * values["AGENTRL_ROLLOUT_N"]
    if rollouts % count:
        errors.append(
            f"train batch x rollout n = {rollouts} (AGENTRL_TRAIN_BATCH_SIZE x AGENTRL_ROLLOUT_N) is not divisible "
            f"by the {count} GPU(s) of GPU_IDS"
        )
    if errors:
        want = config_defaults(path)["AGENTRL_N_GPUS"]
        errors.append(
            f"the {config} config is sized for {want} GPU(s): set GPU_IDS in .env to {want} device(s), e.g. "
            f"GPU_IDS={','.join(str(i) for i in range(want))}, or change the knobs above"
        )
    return count, errors


GPU_SERVICES = ("trainer", "trainer-verl09", "eval", "eval-verl09")  # every service compose gives a GPU


def compose_override(ids: list[str]) -> str:
    """A compose file that gives the GPU services exactly ``ids``, as the list ``device_ids`` takes (compose
    cannot split one variable into a list; ``!override`` replaces compose.yaml's single-id default)."""
    devices = ", ".join(f'"{i}"' for i in ids)
    lines = ["# Written by `make` from GPU_IDS (services/trainer/src/agent_trainer/gpu_plan.py); do not edit.",
             "services:"]  # fmt: skip
    for service in GPU_SERVICES:
        lines += [f"  {service}:", "    deploy:", "      resources:", "        reservations:",
                  "          devices: !override", "            - driver: nvidia", f"              device_ids: [{devices}]",
                  "              capabilities: [gpu]"]  # fmt: skip
    return "\n".join(lines) + "\n"


#: ``DEVICE=cpu``: the CPU build of the trainer images (docker/trainer*.Dockerfile with TRAINER_DEVICE=cpu) on this
#: base (docker/standins/standins.toml builds it: Python and a CPU torch), unless .env names another.
CPU_BASE_IMAGE = "webshop-trainer-cpu-base:torch2.13.0-py3.11"
#: The GPUs a CPU run pretends to have: Ray schedules this many FSDP workers on fake GPU resources, so data
#: parallelism and the collectives (gloo) run as on two GPUs (agent_trainer.cpu_device).
CPU_FAKE_GPUS = 2
#: Each GPU service's image and its base-image build argument (compose.yaml's x-trainer-image, x-trainer09-image).
SERVICE_IMAGES = {
    "trainer": ("agent-trainer", "TRAINER_BASE_IMAGE"),
    "eval": ("agent-trainer", "TRAINER_BASE_IMAGE"),
    "trainer-verl09": ("agent-trainer-verl09", "TRAINER09_BASE_IMAGE"),
    "eval-verl09": ("agent-trainer-verl09", "TRAINER09_BASE_IMAGE"),
}


def cpu_compose_override(base_image: str) -> str:
    """A compose file for ``DEVICE=cpu``: the GPU services keep their job scripts, volumes and settings, and get
    the CPU build of their image (its own tag, so the CUDA image is never replaced) and no GPU reservation."""
    lines = ["# Written by `make ... DEVICE=cpu` (services/trainer/src/agent_trainer/gpu_plan.py); do not edit.",
             "# The same services and job scripts, on the CPU build of the trainer images: only the GPU is substituted.",
             "services:"]  # fmt: skip
    for service in GPU_SERVICES:
        image, base_arg = SERVICE_IMAGES[service]
        lines += [f"  {service}:", f"    image: {image}-cpu:local", "    build:", "      args:",
                  f"        {base_arg}: {base_image}", "        TRAINER_DEVICE: cpu", "    deploy: !reset {}",
                  # no unlimited locked memory (pinned buffers for NCCL and RDMA: a GPU's need), which an engine
                  # without the right to raise that limit refuses to start a container with
                  "    ulimits: !override", "      nofile:", "        soft: ${AGENTRL_NOFILE:-${WEBSHOP_NOFILE:-65535}}",
                  "        hard: ${AGENTRL_NOFILE:-${WEBSHOP_NOFILE:-65535}}", "      stack: 67108864"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True,
                        help="test, full (WebShop), a config's name (textcraft_grpo_test, mixed_grpo_train...) or eval")  # fmt: skip
    parser.add_argument("--env-file", type=Path, default=Path(".env"))
    parser.add_argument("--config-dir", type=Path, default=Path(__file__).resolve().parents[4] / "configs")
    parser.add_argument("--visible", type=int, default=None, help="GPUs on this host (nvidia-smi -L | wc -l)")
    parser.add_argument(
        "--compose-override", type=Path, default=None, help="write the GPU services' device list here"
    )
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                        help="cpu: the CPU build of the trainer images (no GPU; the config must exist, the device "
                        "count is the fake one the CPU run uses) and, with --compose-override, its compose file")  # fmt: skip
    parser.add_argument("--cpu-base-image", action="store_true",
                        help="print the CPU build's base image (TRAINER_CPU_BASE_IMAGE in .env, else the default) and exit")  # fmt: skip
    args = parser.parse_args(argv)
    settings = settings_from(args.env_file, os.environ)
    base_image = settings.get("TRAINER_CPU_BASE_IMAGE") or CPU_BASE_IMAGE
    if args.cpu_base_image:
        print(base_image)
        return 0
    if args.device == "cpu":
        if args.config != "eval":
            try:
                config_file(args.config, args.config_dir)
            except ValueError as error:
                print(f"CPU plan for the {args.config} run: {error}", file=sys.stderr)
                return 2
        if args.compose_override is not None:
            args.compose_override.parent.mkdir(parents=True, exist_ok=True)
            args.compose_override.write_text(cpu_compose_override(base_image))
        print(CPU_FAKE_GPUS)
        return 0
    count, errors = plan_errors(args.config, settings, args.config_dir, args.visible)
    if errors:
        print(f"GPU plan for the {args.config} run: not runnable as configured:", file=sys.stderr)
        for error in errors:
            print(f"  - {error}", file=sys.stderr)
        return 2
    if args.compose_override is not None:
        args.compose_override.parent.mkdir(parents=True, exist_ok=True)
        args.compose_override.write_text(compose_override(parse_gpu_ids(settings.get("GPU_IDS") or "0")))
    print(count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
