"""The device substitution every CPU run shares: ``make rehearse``, ``make learn``, and the CPU build of the trainer
images (``make train-test|eval DEVICE=cpu``: the image sets ``AGENTRL_DEVICE=cpu``, and ``agent-train train`` and
``agent-train eval`` then substitute the device, and only the device).

What is substituted, and why, in one place:

- the seams in every process of the run (:func:`seams`): verl's CPU device (0.7.1: a Ray worker setup hook,
  :mod:`.cpu_verl07`; 0.9.1: the ``cpu`` platform, :mod:`.cpu_platform`), the rollout engine ``cpu``
  (:mod:`.cpu_rollout`), gloo for NCCL, one intra-op thread per process;
- the test config scaled to two cores (:data:`CPU_SCALE`: each Hydra override with its reason);
- the policy: a tiny local model (:mod:`agent_trainer.tiny_model`) where the run names none (``AGENTRL_MODEL_PATH``);
- the eval's model server: :mod:`.chat_server` instead of sglang (``agent-train eval --server cpu``).

:func:`cpu_train` applies them to a launch, and the launcher writes :func:`substitution_lines` into the run's log,
so nobody mistakes a CPU run for the GPU one: everything else (the compose services, the job scripts, the data,
the preflight, verl's trainer, the checkpoint, the merger, the eval) is what a GPU run does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import SUBSTITUTED

#: Where a process learns its device (the trainer images set it from their build argument TRAINER_DEVICE).
DEVICE_ENV = "AGENTRL_DEVICE"
#: GPUs a CPU run pretends to have: Ray schedules the FSDP workers on this many fake GPU resources, so data
#: parallelism and the collectives (gloo) run as on two GPUs. (gpu_plan.CPU_FAKE_GPUS, which make passes on as
#: AGENTRL_N_GPUS, is the same number: gpu_plan.py is standard library only and cannot import this.)
FAKE_GPUS = 2
#: New tokens per model turn on CPU, for every environment, unless AGENTRL_TURN_TOKENS says otherwise (the configs:
#: 200-512): a tiny model's turn of noise needs no more, and training and eval use the same budget.
CPU_TURN_TOKENS = 64
#: Training steps of a CPU run unless an override says otherwise (the test configs: 2 steps of 32 or 64 prompts).
CPU_STEPS = 2

#: The test configs scaled down to two cores: each Hydra override and why. The rehearsal and ``make learn`` add
#: their own (rehearsal.run.SCALE); a CPU run of the trainer images applies these (:func:`cpu_train`).
CPU_SCALE = (
    ("data.train_batch_size=4", "4 prompts per step on 2 cores"),
    ("data.val_max_samples=2", "2 validation prompts"),
    ("data.max_response_length=1024", "4 env steps of short replies and their pages (the configs: 4,096-10,240)"),
    ("data.dataloader_num_workers=0", "no dataloader worker processes on 2 cores"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing=false", "a 2-layer model: no memory to save"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=4", "one optimizer step per training step (the batch)"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "CPU memory and time per micro-batch"),
    ("actor_rollout_ref.actor.use_torch_compile=false", "no compiler toolchain needed on CPU; compile time dominates"),
    ("actor_rollout_ref.actor.fsdp_config.dtype=fp32", "verl 0.7.1's actor autocasts to this dtype: fp32 on CPU"),
    ("actor_rollout_ref.ref.fsdp_config.dtype=fp32", "the reference model as the actor"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "CPU memory and time per micro-batch"),
    ("actor_rollout_ref.rollout.name=cpu", "the CPU rollout engine (rehearsal.cpu_rollout) instead of sglang"),
    ("actor_rollout_ref.rollout.n=4", "4 rollouts per prompt: GRPO groups with different rewards"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1", "CPU memory and time per micro-batch"),
    ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5", "episodes of at most 4 env steps (the goals' plans)"),
    ("actor_rollout_ref.rollout.multi_turn.max_user_turns=5", "as max_assistant_turns"),
    ("actor_rollout_ref.rollout.agent.num_workers=2", "2 agent-loop worker processes on 2 cores"),
    ("reward.num_workers=1", "1 reward worker process"),
    (f"trainer.n_gpus_per_node={FAKE_GPUS}", f"{FAKE_GPUS} FSDP ranks (fake GPUs), so data parallelism and the collectives run"),
    ("ray_kwargs.ray_init.num_cpus=16", "logical CPUs for the run's Ray actors"),
    (f"+ray_kwargs.ray_init.num_gpus={FAKE_GPUS}", "the fake GPUs the FSDP workers are scheduled on"),
    ("+ray_kwargs.ray_init.include_dashboard=false", "no dashboard"),
)  # fmt: skip
#: Env steps per episode on CPU: the 4 that max_assistant_turns=5 above allows (:func:`rounds_overrides`).
CPU_ROUNDS = 4


def rounds_overrides(env_ids: Sequence[str], rounds: int) -> list[str]:
    """``environments.<env>.max_rounds`` for every environment of a run: the interaction and the agent loop end an
    episode after its rounds and never read verl's turn limit, so a scaled-down turn limit needs its rounds too."""
    return [f"++environments.{env_id}.max_rounds={rounds}" for env_id in env_ids]


#: verl 0.7.1 derives FSDP's wrap policy from the model's _no_split_modules, which transformers 5 no longer
#: exposes where 0.7.1 looks: name the decoder layer (the GPU image's transformers 4.57 does not need it).
WRAP_07 = tuple(
    f"+actor_rollout_ref.{role}.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2DecoderLayer]"
    for role in ("actor", "ref")
)
#: verl 0.9.1's TransferQueue: its storage units are a Ray actor process each (~400 MB): 2 on CPU, not verl's 8.
LOCAL_STORAGE_UNITS = 2
#: The CPU seams of each line: the Ray worker setup hook (every worker process) and, on 0.9.1, the platform
#: verl imports in every process at ``import verl``.
SETUP_HOOKS = {
    "0.7": "agent_trainer.rehearsal.cpu_verl07.setup",
    "0.9": "agent_trainer.rehearsal.cpu_platform.setup",
}
PLATFORM_ENV_09 = {
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": "agent_trainer.rehearsal.cpu_platform",
}


def on_cpu(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs on the CPU build (``AGENTRL_DEVICE=cpu``)."""
    return (env if env is not None else os.environ).get(DEVICE_ENV, "").strip().lower() == "cpu"


def seams(line: str, extra: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment and Ray overrides that put the CPU seams into every process of a run on ``line`` (0.7 or
    0.9), with ``extra`` settings for every worker too: ``(env, overrides)``."""
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **dict(extra or {})}
    if line == "0.9":
        env.update(PLATFORM_ENV_09)
    ray = [f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOKS[line]}"]
    if line == "0.9":
        ray.append(f"transfer_queue.backend.SimpleStorage.num_data_storage_units={LOCAL_STORAGE_UNITS}")
    ray += [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}='{v}'" for k, v in env.items()]
    return env, ray


def override_key(override: str) -> str:
    """A Hydra override's key, without its ``+``/``++``/``~`` prefix."""
    return override.split("=", 1)[0].lstrip("+~")


def cpu_train(line: str, overrides: Sequence[str], env: Mapping[str, str], run_dir: Path,
              env_ids: Sequence[str] = ()) -> tuple[dict[str, str], list[str], list[str]]:  # fmt: skip
    """A launch of ``agent-train train`` on the CPU build: ``(env, overrides, substitutions)``.

    ``env_ids``: the environments of the run's config (its ``environments:``), each held to :data:`CPU_ROUNDS`
    env steps an episode. The run's own overrides (``TRAIN_EXTRA_ARGS``) win over :data:`CPU_SCALE` key by key.
    The policy is the run's ``AGENTRL_MODEL_PATH`` where it names one, else a tiny local model built into
    ``run_dir/tiny_model`` from the catalog at ``WEBSHOP_CATALOG`` (its tokenizer is trained on the catalog's text
    and the prompts)."""
    given = {override_key(o) for o in overrides}
    listed = [f"device: the CPU build of the trainer image ({DEVICE_ENV}=cpu); only the GPU is substituted"]
    listed += [s for s in SUBSTITUTED if not s.startswith(("policy:", "eval server:"))]
    out_env = dict(env)
    added: list[str] = []
    why_rounds = (
        f"episodes of at most {CPU_ROUNDS} env steps, as max_assistant_turns allows (the agent loop and the "
        "interaction read the rounds, never verl's turn limit)"
    )
    rounds = [(o, why_rounds) for o in rounds_overrides(env_ids, CPU_ROUNDS)]
    for override, why in (*CPU_SCALE, *rounds, *((o, "transformers 5: name the FSDP wrap class") for o in WRAP_07
                                                 if line == "0.7")):  # fmt: skip
        if override_key(override) in given:
            listed.append(f"{override_key(override)}: the run's own override kept ({why} on CPU otherwise)")
            continue
        added.append(override)
        listed.append(f"{override}: {why}")
    if "trainer.total_training_steps" not in given:
        added.append(f"trainer.total_training_steps={CPU_STEPS}")
        listed.append(
            f"trainer.total_training_steps={CPU_STEPS}: the test configs' two steps, of 4 prompts on CPU"
        )
    if not out_env.get("AGENTRL_TURN_TOKENS"):
        out_env["AGENTRL_TURN_TOKENS"] = str(CPU_TURN_TOKENS)
        listed.append(
            f"AGENTRL_TURN_TOKENS={CPU_TURN_TOKENS}: new tokens per model turn (the configs: 200-512)"
        )
    if not out_env.get("AGENTRL_MODEL_PATH") and "actor_rollout_ref.model.path" not in given:
        out_env["AGENTRL_MODEL_PATH"] = str(tiny_policy(run_dir / "tiny_model", out_env))
        listed.append(f"policy: a tiny local Qwen2-architecture model with random weights ({out_env['AGENTRL_MODEL_PATH']}; "
                      "2 layers, hidden 64, a byte-level BPE tokenizer trained on the catalog) instead of the "
                      "config's Qwen/Qwen2.5-1.5B-Instruct: set AGENTRL_MODEL_PATH for another")  # fmt: skip
    worker, ray = seams(line, {k: out_env[k] for k in ("AGENTRL_TURN_TOKENS",)})
    out_env.update(worker)
    return out_env, [*added, *ray, *overrides], listed


def tiny_policy(model_dir: Path, env: Mapping[str, str]) -> Path:
    """The tiny model of a CPU run (built once per run directory, reused on resume)."""
    from ..tiny_model import build_tiny_model

    catalog = env.get("WEBSHOP_CATALOG") or "data/catalog"
    if not (Path(catalog) / "manifest.json").is_file():
        raise RuntimeError(
            f"a CPU run without AGENTRL_MODEL_PATH builds a tiny model whose tokenizer is trained on the catalog's "
            f"text, and there is no prepared catalog at {catalog} (WEBSHOP_CATALOG): prepare one (make data) or "
            "set AGENTRL_MODEL_PATH to a model directory"
        )
    return build_tiny_model(model_dir, Path(catalog))


def substitution_lines(listed: Sequence[str]) -> str:
    """The block the launcher prints and writes at the top of the run's log."""
    return "\n".join(["agent-train: CPU run: what differs from the GPU run (everything else is the same):",
                      *(f"  - {line}" for line in listed)])  # fmt: skip
