"""``make learn`` (``python -m agent_trainer.rehearsal.learn``): does GRPO through this stack make an agent better
on tasks it never trained on? A training run on CPU through verl's own trainer (the rehearsal's machinery: its CPU
rollout engine, the tiny local model, the real env cluster, the project's agent loop, reward and configs), judged
on held-out tasks before and after with the project's eval on the merged checkpoint.

1. **Base policy** (cached): the environment's expert plays training tasks in process (every env core has one);
   a tokenizer and a tiny Qwen2-architecture model are built locally on those episodes' texts and supervised on
   them (:func:`.warm_start.supervise`, the warm start's loop, episodes rendered through the trainer's spec by
   :func:`.warm_start.expert_episode`) until held-out success is roughly 10-40 %, so that GRPO groups differ.
2. **Before**: ``agent-train eval --env ENV --policy checkpoint --server cpu --tasks ...`` of the base model on the
   held-out tasks (:func:`heldout_tasks`: the environment's test split, which the training data never holds, those
   the expert solves within ``max_plan`` steps), ``eval_samples`` episodes per task at the rollout temperature;
   the greedy eval (the configs' ``val_kwargs``) beside it, reported, not judged.
3. **GRPO**: ``agent-train train --config <env>_grpo_test`` (the project's launcher and config, scaled down to
   2 cores; each override and setting listed in ``substituted``) on training tasks only, the project's reward.
4. **After**: verl's merger on the last checkpoint and the same eval, same tasks and seed.
5. **Supervised control**: the same compute spent on more supervised steps from the base model (forward-pass
   token equivalents, :func:`control_steps`), evaluated the same way: what RL adds over more SFT.
6. **Judgement**: per task the mean success over its episodes; success and mean reward with 95 % intervals, the
   paired difference's interval (paired bootstrap over tasks) and a paired test (sign-flip permutation over tasks;
   McNemar's exact test for one 0/1 episode per task); ``learned`` when held-out success rose and the interval of
   the difference lies above 0 (the rule in docs/learning.md, fixed before the confirming seeds). ``OUT/<env>/seed<S>/summary.json`` and ``report.html`` (the curve as SVG), and
   ``OUT/summary.json`` (the last run).

``AGENTRL_REHEARSAL_INJECT=reward_zero`` zeroes the reward before the advantage: the run must say
``learned: false``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Per environment: the recipe that gives a base policy in the 10-40 % band on held-out tasks (measured; see
#: docs/learning.md). ``max_plan``: training tasks are those the expert solves in at most this many steps.
#: ``heldout``: at most this many held-out tasks; ``heldout_max_plan`` (0: every task): only held-out tasks whose
#: expert solves them within this many steps, the kind of task the training tasks are (never one of them).
RECIPES: dict[str, dict[str, Any]] = {
    "babyai": {"train_tasks": 200, "max_plan": 3, "sft_steps": 6000, "layers": 2, "hidden": 64, "rounds": 4,
               "heldout": 200, "heldout_max_plan": 3, "max_observation_chars": 600, "turn_tokens": 24},
    "textcraft": {"train_tasks": 300, "max_plan": 6, "sft_steps": 8000, "layers": 2, "hidden": 64, "rounds": 8,
                  "heldout": 68, "heldout_max_plan": 0, "max_observation_chars": 200, "turn_tokens": 32},
}  # fmt: skip
DEFAULT_ENV = "babyai"
#: Held-out success of a base policy worth training with GRPO: its groups of rollouts earn different rewards.
BAND = (0.10, 0.40)
SFT_LR = 3e-3


@dataclass
class LearnOptions:
    """What ``make learn`` runs (defaults: :data:`RECIPES` for the environment)."""

    env: str = DEFAULT_ENV
    seed: int = 0
    out_dir: Path = Path("outputs/learn")
    steps: int = 60  # GRPO steps (docs/learning.md: the recipe of the confirming runs)
    prompts: int = 8  # prompts per step (data.train_batch_size)
    rollouts: int = 8  # rollouts per prompt (GRPO group size)
    lr: float = 1e-3
    temperature: float = 1.0
    eval_temperature: float = 1.0  # the judgement's eval: the rollout temperature, eval_samples per task
    eval_samples: int = 8
    eval_seed: int = 0
    heldout_split: str = "test"  # "val" while tuning: the test split is looked at only by the confirming runs
    greedy: bool = True  # also the greedy eval (temperature 0, one episode per task): reported, not judged
    control: bool = True  # also the supervised control
    overrides: dict[str, Any] = field(default_factory=dict)  # recipe keys overridden (--set key=value)

    def recipe(self) -> dict[str, Any]:
        if self.env not in RECIPES:
            raise ValueError(f"make learn: no recipe for {self.env!r}; known: {', '.join(RECIPES)}")
        recipe = {**RECIPES[self.env], **self.overrides}
        unknown = sorted(set(self.overrides) - set(RECIPES[self.env]))
        if unknown:
            raise ValueError(f"make learn: unknown recipe key(s) {', '.join(unknown)}")
        return recipe


def log(message: str) -> None:
    """Progress on the long phases (stderr, flushed, with the wall-clock time)."""
    print(f"[learn {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- tasks and the base policy --------------------------------------------------------------------------------


def expert_plans(env_id: str, split: str, count: int, max_plan: int, cache: Path) -> dict[int, list[str]]:
    """Up to ``count`` tasks of ``split`` (in order) whose expert episode succeeds within ``max_plan`` steps, with
    their plans; cached in ``cache`` (BabyAI's expert is a search: seconds per task on a busy machine)."""
    from .. import env_data
    from .warm_start import expert_episode, make_core

    key = {"env": env_id, "split": split, "count": count, "max_plan": max_plan}
    if cache.exists():
        stored = json.loads(cache.read_text())
        if stored.get("key") == key:
            return {int(t): plan for t, plan in stored["plans"].items()}
    core = make_core(env_id)
    plans: dict[int, list[str]] = {}
    candidates = env_data.split_tasks(env_id, split)
    started = time.monotonic()
    for index, task in enumerate(candidates):
        if len(plans) >= count:
            break
        plan = list(core.expert(task) or [])
        if plan and len(plan) <= max_plan and expert_episode(env_id, task, plan, core=core)[1]["success"]:
            plans[task] = plan
        if index % 50 == 49:
            log(
                f"expert plans: {len(plans)}/{count} from {index + 1} {split} tasks ({time.monotonic() - started:.0f} s)"
            )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "plans": {str(t): p for t, p in plans.items()}}))
    return plans


def heldout_tasks(options: LearnOptions, recipe: Mapping[str, Any]) -> list[int]:
    """The held-out tasks (the ``heldout_split``, never a training task): the first ``heldout`` of the split, or,
    with ``heldout_max_plan``, those whose expert solves them within that many steps (cached like the training
    plans), the kind of task GRPO trains on."""
    from .. import env_data

    count, max_plan = int(recipe["heldout"]), int(recipe.get("heldout_max_plan") or 0)
    if max_plan <= 0:
        return env_data.split_tasks(options.env, options.heldout_split)[:count]
    cache = options.out_dir / options.env / f"plans-{options.heldout_split}.json"
    return sorted(expert_plans(options.env, options.heldout_split, count, max_plan, cache))


def episodes(
    env_id: str, plans: Mapping[int, Sequence[str]], cap: int
) -> list[tuple[list[dict[str, str]], str]]:
    """(conversation so far, the expert's reply) of every step of every plan, as the agent loop renders them."""
    from .warm_start import expert_episode, make_core

    core = make_core(env_id)
    out: list[tuple[list[dict[str, str]], str]] = []
    for task, plan in plans.items():
        out += expert_episode(env_id, int(task), list(plan), core=core, max_observation_chars=cap)[0]
    return out


def tokenizer_texts(examples: Sequence[tuple[list[dict[str, str]], str]]) -> list[str]:
    """The texts the base model's tokenizer is trained on: the training episodes' turns (no held-out task)."""
    texts: list[str] = []
    seen: set[str] = set()
    for messages, reply in examples:
        for text in [*(m["content"] for m in messages), reply]:
            if text not in seen:
                seen.add(text)
                texts.append(text)
    return texts


def build_base(options: LearnOptions, recipe: Mapping[str, Any], plans: Mapping[int, Sequence[str]]) -> Path:
    """The base policy (cached under ``OUT/<env>/base``, keyed by its recipe): tokenizer and tiny model built on
    the training episodes, then ``sft_steps`` supervised episode steps (the warm start's loop)."""
    from ..tiny_model import build_tiny_model
    from .warm_start import MARKER, recipe_stale, supervise

    cap = int(recipe["max_observation_chars"])
    examples = episodes(options.env, plans, cap)
    sft = {"env": options.env, "tasks": sorted(int(t) for t in plans), "steps": int(recipe["sft_steps"]),
           "lr": SFT_LR, "seed": 0, "max_observation_chars": cap, "layers": recipe["layers"],
           "hidden": recipe["hidden"]}  # fmt: skip
    model_dir = (options.out_dir / options.env / "base").resolve()
    build_tiny_model(model_dir, None, hidden_size=int(recipe["hidden"]), layers=int(recipe["layers"]),
                     texts=tokenizer_texts(examples), force=recipe_stale(model_dir, sft))  # fmt: skip
    if recipe_stale(model_dir, sft) or not (model_dir / MARKER).exists():
        log(
            f"base policy: {recipe['sft_steps']} supervised episode steps on {len(plans)} training tasks' expert "
            "episodes (the first build; cached after)"
        )
    started = time.monotonic()
    report = supervise(model_dir, examples, sft, steps=int(recipe["sft_steps"]), lr=SFT_LR, seed=0)
    if time.monotonic() - started > 1:
        log(f"base policy: {recipe['sft_steps']} supervised steps in {time.monotonic() - started:.0f} s "
            f"(loss {report.get('first_loss')} -> {report.get('last_loss')})")  # fmt: skip
    return model_dir


def control_steps(trajectory_tokens: int, ppo_epochs: int, episode_tokens: float) -> int:
    """Supervised steps worth the GRPO run's compute, counted in forward-pass token equivalents (a backward pass
    costs two forwards): GRPO spends per trajectory token one generation pass, the old and reference log-prob
    passes and ``ppo_epochs`` forward-backward passes, ``3 + 3 * ppo_epochs``; a supervised step spends 3 per
    token of one expert episode."""
    if episode_tokens <= 0:
        raise ValueError("control_steps: episode_tokens must be positive")
    return max(1, math.ceil(trajectory_tokens * (3 + 3 * ppo_epochs) / (3 * episode_tokens)))


# ---- evaluation and statistics --------------------------------------------------------------------------------


def evaluate(options: LearnOptions, recipe: Mapping[str, Any], model: Path, url: str, out: Path, env: Mapping[str, str],
             logfile: Path, tasks: Sequence[int], *, temperature: float | None = None,
             samples: int | None = None) -> dict[str, Any]:  # fmt: skip
    """``agent-train eval --env ENV --policy checkpoint --server cpu --tasks ...`` on the held-out tasks,
    ``samples`` times (sampling seeds ``eval_seed + i``; ``OUT/sample<i>``) at ``temperature`` (default: the
    options' judgement eval); per task the mean success and reward over the samples. A finished eval directory is
    reused when its model, tasks and settings are the same."""
    from .run import _run_trainer

    temperature = options.eval_temperature if temperature is None else temperature
    samples = options.eval_samples if samples is None else samples
    if samples < 1:
        raise ValueError("evaluate: samples must be at least 1")
    out = Path(out).resolve()
    split = {"test": "test", "val": "eval", "train": "train"}[options.heldout_split]
    per_task: dict[int, dict[str, float]] = {}
    episodes_, wall = 0, 0.0
    for index in range(samples):
        directory = out / f"sample{index}"
        directory.mkdir(parents=True, exist_ok=True)
        metrics_path, trajectories = directory / "metrics.json", directory / "trajectories.jsonl"
        stamp = directory / "learn-model.txt"
        key = json.dumps({"model": _model_digest(model), "tasks": list(tasks), "split": split,
                          "temperature": temperature, "seed": options.eval_seed + index,
                          "rounds": recipe["rounds"]})  # fmt: skip
        if not (metrics_path.exists() and stamp.exists() and stamp.read_text() == key):
            log(f"held-out eval {index + 1}/{samples} of {model} on {len(tasks)} {options.env} {options.heldout_split} "
                f"tasks at temperature {temperature}")  # fmt: skip
            command = [sys.executable, "-m", "agent_trainer.cli", "eval", "--env", options.env, "--policy",
                       "checkpoint", "--server", "cpu", "--model-path", str(model), "--url", url, "--split", split,
                       "--tasks", ",".join(str(t) for t in tasks), "--max-steps", str(recipe["rounds"]),
                       "--temperature", str(temperature), "--seed", str(options.eval_seed + index),
                       "--max-tokens", str(recipe["turn_tokens"]),
                       "--max-observation-chars", str(recipe["max_observation_chars"]), "--out", str(directory),
                       "--overwrite", "--no-progress", "--no-report", "--startup-timeout", "600"]  # fmt: skip
            code = _run_trainer(command, dict(env), logfile, out.parent, timeout=7200)
            if code != 0 or not metrics_path.exists():
                raise RuntimeError(f"agent-train eval of {model} failed (exit {code}); see {logfile}")
            stamp.write_text(key)
        metrics = json.loads(metrics_path.read_text())
        wall += float(metrics.get("wall_s") or 0.0)
        for line in trajectories.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                task = per_task.setdefault(
                    int(record.get("task", record.get("goal"))), {"success": 0.0, "reward": 0.0}
                )
                task["success"] += float(bool(record.get("success"))) / samples
                task["reward"] += float(record.get("reward") or 0.0) / samples
                episodes_ += 1
    if sorted(per_task) != sorted(int(t) for t in tasks) or episodes_ != samples * len(tasks):
        raise RuntimeError(
            f"the eval of {model} in {out} lacks episodes ({episodes_} of {samples * len(tasks)})"
        )
    success = [v["success"] for v in per_task.values()]
    reward = [v["reward"] for v in per_task.values()]
    metrics = {"episodes": episodes_, "tasks": len(per_task), "samples_per_task": samples,
               "temperature": temperature, "success_rate": sum(success) / len(success),
               "success_rate_ci95": list(bootstrap_mean(success, seed=options.eval_seed)),
               "mean_reward": sum(reward) / len(reward),
               "mean_reward_ci95": list(bootstrap_mean(reward, seed=options.eval_seed)),
               "wall_s": round(wall, 1)}  # fmt: skip
    return {"metrics": metrics, "per_task": per_task, "out": str(out)}


def bootstrap_mean(values: Sequence[float], seed: int = 0, samples: int = 10000) -> tuple[float, float]:
    """95 % percentile interval of the mean of per-task values, resampling tasks (the samples of one task stay
    together: they are not independent of each other)."""
    from ..evaluation.metrics import bootstrap_mean_interval

    if not values:
        raise ValueError("bootstrap_mean: needs values")
    return bootstrap_mean_interval(list(values), seed=seed, resamples=samples)


def _model_digest(model: Path) -> str:
    """What a cached eval is keyed by: the weights' bytes."""
    digest = hashlib.sha256()
    for path in sorted(Path(model).glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def mcnemar_exact(before: Sequence[bool], after: Sequence[bool]) -> dict[str, Any]:
    """McNemar's exact test on paired outcomes: two-sided binomial p of the discordant pairs."""
    if len(before) != len(after):
        raise ValueError("mcnemar_exact: the pairs differ in length")
    gained = sum(1 for b, a in zip(before, after, strict=True) if a and not b)
    lost = sum(1 for b, a in zip(before, after, strict=True) if b and not a)
    n = gained + lost
    if n == 0:
        return {"gained": 0, "lost": 0, "p_value": 1.0}
    tail = sum(math.comb(n, k) for k in range(0, min(gained, lost) + 1)) / 2**n
    return {"gained": gained, "lost": lost, "p_value": min(1.0, 2 * tail)}


def paired_bootstrap(before: Sequence[float], after: Sequence[float], seed: int = 0, samples: int = 10000
                     ) -> tuple[float, float]:  # fmt: skip
    """95 % percentile interval of mean(after - before), resampling tasks (pairs kept together)."""
    from ..evaluation.metrics import bootstrap_mean_interval

    if len(before) != len(after) or not before:
        raise ValueError("paired_bootstrap: needs equal, non-empty pairs")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    return bootstrap_mean_interval(diffs, seed=seed, resamples=samples)


def sign_flip_test(diffs: Sequence[float], seed: int = 0, samples: int = 20000) -> float:
    """Two-sided paired permutation (sign-flip) test of mean(diffs) = 0: each task's difference keeps or flips
    its sign at random under the null; exact over every flip when at most 16 differences are non-zero."""
    nonzero = [d for d in diffs if d != 0]
    if not nonzero:
        return 1.0
    observed = abs(sum(nonzero)) - 1e-12
    if len(nonzero) <= 16:
        hits = sum(
            1
            for mask in range(2 ** len(nonzero))
            if abs(sum(-d if mask >> i & 1 else d for i, d in enumerate(nonzero))) >= observed
        )
        return hits / 2 ** len(nonzero)
    rng = random.Random(seed)
    hits = sum(
        1 for _ in range(samples) if abs(sum(d if rng.random() < 0.5 else -d for d in nonzero)) >= observed
    )
    return (hits + 1) / (samples + 1)


def compare(before: Mapping[str, Any], after: Mapping[str, Any], seed: int = 0) -> dict[str, Any]:
    """The paired comparison of two evals of the same tasks (per task: the mean success and reward over its
    samples): differences, their paired-bootstrap intervals over tasks, and the p-value: McNemar's exact test when
    every task has one 0/1 outcome (one greedy episode), else the paired sign-flip permutation test over tasks."""
    tasks = sorted(set(before["per_task"]) & set(after["per_task"]))
    if not tasks:
        raise ValueError("compare: the evals share no task")
    b = [before["per_task"][t] for t in tasks]
    a = [after["per_task"][t] for t in tasks]
    success = ([float(x["success"]) for x in b], [float(x["success"]) for x in a])
    reward = ([x["reward"] for x in b], [x["reward"] for x in a])
    out = {"tasks": len(tasks),
           "success_diff": sum(success[1]) / len(tasks) - sum(success[0]) / len(tasks),
           "success_diff_ci95": list(paired_bootstrap(*success, seed=seed)),
           "reward_diff": sum(reward[1]) / len(tasks) - sum(reward[0]) / len(tasks),
           "reward_diff_ci95": list(paired_bootstrap(*reward, seed=seed)),
           "tasks_better": sum(1 for x, y in zip(*success, strict=True) if y > x),
           "tasks_worse": sum(1 for x, y in zip(*success, strict=True) if y < x)}  # fmt: skip
    single = all(int((e.get("metrics") or {}).get("samples_per_task", 1)) == 1 for e in (before, after))
    if single and all(v in (0.0, 1.0) for v in success[0] + success[1]):
        test = mcnemar_exact([v == 1.0 for v in success[0]], [v == 1.0 for v in success[1]])
        out.update(mcnemar=test, p_value=test["p_value"], test="McNemar exact")
    else:
        diffs = [y - x for x, y in zip(*success, strict=True)]
        out.update(p_value=sign_flip_test(diffs, seed=seed), test="paired sign-flip permutation over tasks")
    return out


def learned(comparison: Mapping[str, Any]) -> bool:
    """Held-out success rose and the paired interval of the rise excludes 0."""
    return comparison["success_diff"] > 0 and comparison["success_diff_ci95"][0] > 0


# ---- GRPO through verl ------------------------------------------------------------------------------------------


def scale(options: LearnOptions, recipe: Mapping[str, Any], line: str, train_rows: int, prompt_tokens: int,
          page_tokens: int = 320) -> list[tuple[str, str]]:  # fmt: skip
    """The rehearsal's scale-down of the test config (:data:`.run.SCALE`), changed where learning needs it: each
    override and why (listed with the config's own value in ``substituted``)."""
    from .device import rounds_overrides
    from .run import SCALE

    response = 64 * math.ceil(int(recipe["rounds"]) * (int(recipe["turn_tokens"]) + page_tokens) / 64)
    changed = {
        "data.train_batch_size": (str(options.prompts), f"{options.prompts} prompts per step on 2 cores"),
        "data.max_prompt_length": (str(prompt_tokens), "the longest first turn of the run's tasks"),
        "data.max_response_length": (str(response), f"{recipe['rounds']} rounds of a reply and a page of at most "
                                      f"{page_tokens} tokens (pages cut; verl pads every sequence to this)"),
        "actor_rollout_ref.actor.ppo_mini_batch_size": (str(options.prompts), "one optimizer step per PPO epoch"),
        "actor_rollout_ref.actor.optim.lr": (str(options.lr), "a tiny model learns in a few steps (1e-6 is for 1.5B)"),
        "actor_rollout_ref.rollout.n": (str(options.rollouts), f"GRPO groups of {options.rollouts}"),
        "actor_rollout_ref.rollout.temperature": (str(options.temperature), "the configs' rollout temperature"),
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": (str(int(recipe["rounds"]) + 1),
                                                                     "one more than the rounds (the configs' rule)"),
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": (str(int(recipe["rounds"]) + 1), "as max_assistant_turns"),
        "trainer.save_freq": (str(options.steps), "one checkpoint, at the last step"),
        "trainer.test_freq": ("-1", "held-out points come from the project's eval before and after"),
        "data.val_max_samples": ("2", "verl's own validation: 2 prompts"),
    }  # fmt: skip
    out = []
    for override, why in SCALE:
        key = override.lstrip("+").split("=", 1)[0]
        if key in changed:
            value, reason = changed.pop(key)
            out.append((f"{override.split('=', 1)[0]}={value}", reason))
        else:
            out.append((override, why))
    out += [(f"{k}={v}", why) for k, (v, why) in changed.items()]
    out += [
        *((o, "the run's rounds (its tasks' plans are short)")
          for o in rounds_overrides([options.env], int(recipe["rounds"]))),
        (f"data.train_max_samples={train_rows}", "every training task once per epoch"),
        (f"data.seed={options.seed}", "make learn's SEED: the data order"),
        ("trainer.val_before_train=false", "held-out points come from the project's eval"),
        (f"trainer.total_epochs={max(1, math.ceil(options.steps * options.prompts / train_rows))}",
         "enough epochs for the steps"),
    ]  # fmt: skip
    return out


def write_rows(env_id: str, tasks: Sequence[int], path: Path, agent_name: str | None = None) -> None:
    """``agent-train data``'s rows (``env_data.RowBuilder``) for exactly ``tasks``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .. import env_data

    builder = env_data.RowBuilder(env_id, None)
    rows = []
    for index, task in enumerate(tasks):
        row = builder.row(int(task), "train", index)
        if agent_name:
            row["agent_name"] = agent_name
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=env_data.SCHEMA), path)


def page_length(model: Path, examples: Sequence[tuple[list[dict[str, str]], str]]) -> int:
    """The longest later user turn (an env page, cut) of the expert's episodes in the model's tokens, with the chat
    template's turn markers."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    pages = {m["content"] for messages, _ in examples for m in messages[2:] if m["role"] == "user"}
    return max((len(tokenizer.encode(page, add_special_tokens=False)) for page in pages), default=64) + 16


def prompt_length(model: Path, env_id: str, tasks: Sequence[int]) -> int:
    """The longest first turn of ``tasks`` in the model's tokens, rounded up to 64."""
    from transformers import AutoTokenizer

    from .. import envs
    from .warm_start import answer, make_core

    tokenizer = AutoTokenizer.from_pretrained(model)
    spec, core = envs.get(env_id), make_core(env_id)
    longest = 0
    for task in tasks:
        messages = [{"role": "system", "content": spec.system_prompt},
                    {"role": "user", "content": spec.first_message(answer(core.reset(int(task))))}]  # fmt: skip
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        longest = max(longest, len(ids["input_ids"] if isinstance(ids, Mapping) else ids))
    return 64 * math.ceil((longest + 8) / 64)


def grpo(options: LearnOptions, recipe: Mapping[str, Any], base: Path, plans: Mapping[int, Sequence[str]],
         url: str, work: Path, logfile: Path, catalog: Path) -> dict[str, Any]:  # fmt: skip
    """``agent-train train --config <env>_grpo_test`` on the training tasks, scaled down; the metrics verl
    logged per step, the last checkpoint, the run's overrides."""
    from ..config import installed_verl_line
    from .run import (
        WRAP_07,
        _all_metrics,
        _line_env,
        _run_trainer,
        loop_configs,
        train_routes,
        training_config,
    )

    line = installed_verl_line()
    tasks = sorted(plans)
    route = train_routes(line, [options.env])[options.env]
    data = work / "data"
    write_rows(options.env, tasks, data / "train.parquet", agent_name=route)
    write_rows(options.env, tasks[:2], data / "val.parquet")
    from .. import envs

    prompt = prompt_length(base, options.env, tasks)
    env, ray = _line_env(line, work, url, int(recipe["turn_tokens"]), catalog, False)
    env.pop(
        "AGENTRL_REHEARSAL_CHECKS", None
    )  # the rehearsal's checks are its own business, not the learning's
    ray = [o for o in ray if "AGENTRL_REHEARSAL_CHECKS" not in o]
    env["AGENTRL_INVALID_ACTION_PENALTY"] = "0.0"  # the project's reward, as the configs have it
    ray = [o for o in ray if "AGENTRL_INVALID_ACTION_PENALTY" not in o]
    ray.append("+ray_kwargs.ray_init.runtime_env.env_vars.AGENTRL_INVALID_ACTION_PENALTY='0.0'")
    env["AGENTRL_ROLLOUT_SEED"] = str(options.seed)
    ray.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.AGENTRL_ROLLOUT_SEED='{options.seed}'")
    env.update(loop_configs(work, int(recipe["max_observation_chars"])))
    pages = page_length(base, episodes(options.env, plans, int(recipe["max_observation_chars"])))
    overrides = scale(options, recipe, line, len(tasks), prompt, pages)
    run_dir = work / "runs"
    shutil.rmtree(run_dir, ignore_errors=True)
    checkpoints = run_dir / "learn" / "checkpoints"
    command = [sys.executable, "-m", "agent_trainer.cli", "train", "--config", training_config(line, [options.env]),
               "--experiment", "learn", "--output-dir", str(run_dir), *(o for o, _ in overrides),
               *(WRAP_07 if line == "0.7" else ()), *ray, f"actor_rollout_ref.model.path={base}",
               f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'val.parquet'}",
               f"trainer.default_local_dir={checkpoints}", f"trainer.total_training_steps={options.steps}"]  # fmt: skip
    log(
        f"GRPO: {options.steps} steps of {options.prompts} x {options.rollouts} rollouts on {len(tasks)} "
        f"{options.env} training tasks (verl {line}); log {logfile}"
    )
    started = time.monotonic()
    code = _run_with_progress(command, env, logfile, work, run_dir / "learn" / "metrics", options.steps,
                              _run_trainer)  # fmt: skip
    seconds = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"GRPO failed (exit {code}); see {logfile}")
    last = checkpoints / f"global_step_{options.steps}"
    if not last.is_dir():
        raise RuntimeError(f"GRPO left no checkpoint at {last}; see {logfile}")
    return {"line": line, "checkpoint": last, "metrics": _all_metrics(run_dir / "learn" / "metrics"),
            "seconds": seconds, "overrides": overrides, "config": training_config(line, [options.env]),
            "spec": envs.get(options.env).reward_rule}  # fmt: skip


def _run_with_progress(command: list[str], env: Mapping[str, str], logfile: Path, cwd: Path, metrics: Path,
                       steps: int, runner: Any) -> int:  # fmt: skip
    """Run ``command`` (``runner``: the rehearsal's ``_run_trainer``) while a thread reports each step verl
    logs."""
    import threading

    from .run import _all_metrics

    done = threading.Event()

    def watch() -> None:
        seen = 0
        while True:
            stopped = done.wait(15)
            rows = [r for r in _all_metrics(metrics) if r["step"] >= 1]
            for row in rows[seen:]:
                log(f"GRPO step {row['step']}/{steps}: reward {_num(row, REWARD_KEYS):.3f}, "
                    f"step time {_num(row, ('timing_s/step',)):.0f} s")  # fmt: skip
            seen = len(rows)
            if stopped:
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        return runner(command, dict(env), logfile, cwd, timeout=6 * 3600)
    finally:
        done.set()
        thread.join(timeout=30)


REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")


def _num(row: Mapping[str, Any], keys: Sequence[str]) -> float:
    for key in keys:
        if isinstance(row.get(key), int | float):
            return float(row[key])
    return float("nan")


def curve(metrics: Sequence[Mapping[str, Any]], env_id: str) -> dict[str, list[float]]:
    """Per training step: reward, success and invalid rate (verl's logged metrics; the per-environment ones the
    project's metric step adds, ``env/<env>/...``), and the mean response length."""
    rows = [r for r in metrics if r["step"] >= 1]
    prefix = f"env/{env_id}/"
    return {"step": [float(r["step"]) for r in rows],
            "reward": [_num(r, (prefix + "reward_mean", *REWARD_KEYS)) for r in rows],
            "success": [_num(r, (prefix + "success_rate", f"{env_id}/success/mean")) for r in rows],
            "invalid": [_num(r, (prefix + "invalid_rate", f"{env_id}/invalid_rate/mean")) for r in rows],
            "response_length": [_num(r, ("response_length/mean",)) for r in rows]}  # fmt: skip


# ---- the run ----------------------------------------------------------------------------------------------------


def run_dir(options: LearnOptions) -> Path:
    """``OUT/<env>/seed<S>``, with the injected bugs' names appended (``seed0-reward_zero``): a run with a bug
    never overwrites a clean one (the base model and its eval are shared)."""
    from .inject import injected

    bugs = injected()
    return (
        options.out_dir / options.env / f"seed{options.seed}{'-' + '+'.join(bugs) if bugs else ''}"
    ).resolve()


def run_learn(options: LearnOptions) -> dict[str, Any]:
    """The whole ``make learn`` for the installed verl line; returns (and writes) the summary."""
    from importlib.metadata import version

    from ..evaluation.model_path import resolve_model_path
    from ..harness.catalog import default_catalog
    from ..harness.cluster import start_cluster
    from .inject import injected

    started = time.monotonic()
    recipe = options.recipe()
    work = run_dir(options)
    work.mkdir(parents=True, exist_ok=True)
    logfile = work / "learn.log"
    logfile.write_text("")
    summary: dict[str, Any] = {"learned": False, "env": options.env, "seed": options.seed,
                               "verl_version": version("verl"), "injected": injected(), "errors": [],
                               "options": {k: str(v) for k, v in asdict(options).items()}, "recipe": recipe}  # fmt: skip
    stop = None
    try:
        phase = time.monotonic()
        plans = expert_plans(options.env, "train", int(recipe["train_tasks"]), int(recipe["max_plan"]),
                             options.out_dir / options.env / "plans.json")  # fmt: skip
        base = build_base(options, recipe, plans)
        summary["base"] = {
            "model": str(base),
            "train_tasks": len(plans),
            "seconds": round(time.monotonic() - phase),
        }
        catalog = default_catalog(work).resolve()
        cluster = start_cluster(catalog, work / "cluster", served=[options.env])
        stop = cluster.stop
        env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        tasks = heldout_tasks(options, recipe)
        summary["heldout_tasks"] = tasks
        shared_evals = options.out_dir / options.env / f"eval-{options.heldout_split}"
        tag = f"t{options.eval_temperature:g}"  # sample<i> keyed by its seed: k=4 reuses a k=8 eval's first 4
        before = evaluate(
            options, recipe, base, cluster.url, shared_evals / f"base-{tag}", env, logfile, tasks
        )
        summary["before"] = before["metrics"]
        rate = float(before["metrics"].get("success_rate") or 0.0)
        summary["base_in_band"] = BAND[0] <= rate <= BAND[1]
        log(
            f"base policy: held-out success {rate:.1%} ({'in' if summary['base_in_band'] else 'OUTSIDE'} the "
            f"{BAND[0]:.0%}-{BAND[1]:.0%} band where GRPO groups differ)"
        )
        trained = grpo(options, recipe, base, plans, cluster.url, work, logfile, catalog)
        summary["steps"] = options.steps
        summary["grpo_seconds"] = round(trained["seconds"])
        summary["seconds"] = round(time.monotonic() - started, 1)
        summary["verl_line"] = trained["line"]
        merged = Path(resolve_model_path(trained["checkpoint"]).serve)
        after = evaluate(options, recipe, merged, cluster.url, work / f"eval_after-{options.heldout_split}-{tag}",
                         env, logfile, tasks)  # fmt: skip
        summary["after"] = after["metrics"]
        comparison = compare(before, after, seed=options.eval_seed)
        summary["comparison"] = comparison
        summary["ci"] = comparison["success_diff_ci95"]
        summary["p_value"] = comparison["p_value"]
        summary["learned"] = learned(comparison)
        summary["curve"] = curve(trained["metrics"], options.env)
        summary["heldout_split"] = options.heldout_split
        _write_summary(summary, work, options.out_dir)  # the verdict first; the greedy eval is extra
        if options.greedy:
            greedy = {name: evaluate(options, recipe, model, cluster.url, directory, env, logfile, tasks,
                                     temperature=0.0, samples=1)
                      for name, model, directory in (
                          ("before", base, shared_evals / "base-greedy"),
                          ("after", merged, work / f"eval_after-{options.heldout_split}-greedy"))}  # fmt: skip
            summary["greedy"] = {"before": greedy["before"]["metrics"], "after": greedy["after"]["metrics"],
                                 "comparison": compare(greedy["before"], greedy["after"], seed=options.eval_seed)}  # fmt: skip
        summary["substituted"] = [f"{o}: {why}" for o, why in trained["overrides"]] + [
            f"config: {trained['config']} of verl {trained['line']}'s configs (make train-test ENV={options.env})",
            f"policy: a tiny local Qwen2-architecture model ({recipe['layers']} layers, hidden {recipe['hidden']}, "
            f"byte-level BPE trained on the training episodes) supervised for {recipe['sft_steps']} episode steps on "
            f"the expert's episodes of {len(plans)} training tasks, instead of Qwen/Qwen2.5-1.5B-Instruct",
            f"max_observation_chars={recipe['max_observation_chars']} (configs: 0): pages cut so episodes fit",
            f"AGENTRL_TURN_TOKENS={recipe['turn_tokens']} (configs: 200-512): the expert's replies are short",
            f"eval: {len(tasks)} tasks of the {options.heldout_split} split ("
            + (
                f"those the expert solves within {recipe['heldout_max_plan']} steps, as the training tasks; "
                if int(recipe.get("heldout_max_plan") or 0) > 0
                else ""
            )
            + f"at most {recipe['heldout']}), at most {recipe['rounds']} steps, {options.eval_samples} episode(s) per "
            f"task at temperature {options.eval_temperature} (seeds {options.eval_seed}..."
            f"{options.eval_seed + options.eval_samples - 1}); the greedy eval (the configs' val_kwargs) reported "
            "beside it",
            "the rehearsal's CPU stand-ins (agent_trainer.rehearsal.SUBSTITUTED)",
        ]
        _write_summary(summary, work, options.out_dir)  # the verdict is kept even if the control is cut short
        if options.control:
            summary["control"] = supervised_control(
                options, recipe, base, plans, trained, cluster.url, env, logfile
            )
    except Exception as error:  # every failure goes into the summary
        summary["errors"].append(f"{type(error).__name__}: {error}")
        log(f"FAILED: {error}")
    finally:
        if stop is not None:
            stop()
    summary["seconds"] = round(time.monotonic() - started, 1)
    _write_summary(summary, work, options.out_dir)
    return summary


def _write_summary(summary: dict[str, Any], work: Path, out_dir: Path) -> None:
    """``summary.json`` in the run's folder and ``OUT/summary.json``, and the report next to the first."""
    summary["report"] = str(write_report(summary, work / "report.html"))
    text = json.dumps(summary, indent=2, default=str) + "\n"
    (work / "summary.json").write_text(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(text)


def supervised_control(options: LearnOptions, recipe: Mapping[str, Any], base: Path,
                       plans: Mapping[int, Sequence[str]], trained: Mapping[str, Any], url: str,
                       env: Mapping[str, str], logfile: Path) -> dict[str, Any]:  # fmt: skip
    """More supervised steps from the base model, as many as the GRPO run's compute buys (:func:`control_steps`),
    evaluated on the same held-out tasks."""
    from transformers import AutoTokenizer

    from .warm_start import episode_streams, supervise

    cap = int(recipe["max_observation_chars"])
    examples = episodes(options.env, plans, cap)
    tokenizer = AutoTokenizer.from_pretrained(base)
    streams = episode_streams(tokenizer, examples)
    episode_tokens = sum(len(ids) for ids, _ in streams) / len(streams)
    rows = [r for r in trained["metrics"] if r["step"] >= 1]
    per_step = options.prompts * options.rollouts
    lengths = [_num(r, ("response_length/mean",)) + _num(r, ("prompt_length/mean",)) for r in rows]
    lengths = [x for x in lengths if math.isfinite(x)] or [episode_tokens]
    tokens = int(sum(lengths) / len(lengths) * per_step * len(rows or [0]))
    ppo_epochs = 1
    for override, _ in trained["overrides"]:
        if override.startswith("actor_rollout_ref.actor.ppo_epochs="):
            ppo_epochs = int(override.split("=", 1)[1])
    steps = control_steps(
        tokens, _config_ppo_epochs(options.env, trained["line"], ppo_epochs), episode_tokens
    )
    directory = (options.out_dir / options.env / f"control-seed{options.seed}").resolve()
    if not (directory / "config.json").exists():
        shutil.copytree(base, directory, dirs_exist_ok=True)
    sft = {"env": options.env, "control_of": str(base), "steps": steps, "lr": SFT_LR, "seed": options.seed + 1,
           "max_observation_chars": cap, "base": _model_digest(base)}  # fmt: skip
    log(
        f"supervised control: {steps} more supervised steps from the base model (GRPO's {tokens} trajectory "
        "tokens in forward-pass equivalents)"
    )
    started = time.monotonic()
    supervise(directory, examples, sft, steps=steps, lr=SFT_LR, seed=options.seed + 1)
    seconds = time.monotonic() - started
    work = run_dir(options)
    tasks = heldout_tasks(options, recipe)
    tag = f"t{options.eval_temperature:g}"  # sample<i> keyed by its seed: k=4 reuses a k=8 eval's first 4
    shared = options.out_dir / options.env / f"eval-{options.heldout_split}"
    result = evaluate(options, recipe, directory, url, work / f"eval_control-{options.heldout_split}-{tag}", env,
                      logfile, tasks)  # fmt: skip
    before = evaluate(options, recipe, base, url, shared / f"base-{tag}", env, logfile, tasks)
    return {"steps": steps, "seconds": round(seconds), "trajectory_tokens": tokens, "after": result["metrics"],
            "comparison": compare(before, result, seed=options.eval_seed)}  # fmt: skip


def _config_ppo_epochs(env_id: str, line: str, fallback: int) -> int:
    """``actor.ppo_epochs`` of the run's config (composed: its environment's file over the line's base; verl's own
    default is not in it), else ``fallback``."""
    from omegaconf import OmegaConf

    from ..config import load_training_config
    from .run import line_config_dir, training_config

    try:
        config = load_training_config(
            training_config(line, [env_id]), directory=line_config_dir(line), with_verl=False
        )
    except FileNotFoundError:
        return fallback
    value = OmegaConf.select(config, "actor_rollout_ref.actor.ppo_epochs")
    return int(value) if isinstance(value, int) else fallback


def write_report(summary: Mapping[str, Any], path: Path) -> Path:
    """An HTML page with the curve (SVG: per-step reward, success, invalid rate; held-out points) and the
    figures."""
    from html import escape

    from ..evaluation.svg import line_chart

    curve_ = summary.get("curve") or {"step": [], "reward": [], "success": [], "invalid": []}
    steps = curve_["step"]
    last = float(summary.get("steps") or (steps[-1] if steps else 1))
    held = []
    if summary.get("before") and summary.get("after"):
        held.append(("held-out success (eval)", [0.0, last],
                     [summary["before"]["success_rate"], summary["after"]["success_rate"]]))  # fmt: skip
    control = summary.get("control") or {}
    if control.get("after") and summary.get("before"):
        held.append(("SFT control (eval)", [0.0, last],
                     [summary["before"]["success_rate"], control["after"]["success_rate"]]))  # fmt: skip
    training = line_chart([("train reward", steps, curve_["reward"]), ("train success", steps, curve_["success"]),
                           ("invalid rate", steps, curve_["invalid"])],
                          f"GRPO on {summary['env']} (seed {summary['seed']}): training rollouts")  # fmt: skip
    heldout = line_chart(held, "held-out success: before (step 0) and after", x_label="GRPO step")
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(json.dumps(summary.get(k), default=str))}</td></tr>"
                   for k in ("learned", "before", "after", "ci", "p_value", "comparison", "greedy", "control", "steps",
                             "seconds", "grpo_seconds", "env", "verl_version", "seed", "injected", "errors"))  # fmt: skip
    path.write_text(f"<!doctype html><meta charset=utf-8><title>make learn: {escape(summary['env'])}</title>"
                    f"<h1>make learn: {escape(summary['env'])}, seed {summary['seed']}</h1>"
                    f"<p>learned: <b>{summary.get('learned')}</b></p>{training}{heldout}"
                    f"<table border=1 cellpadding=4>{rows}</table>")  # fmt: skip
    path.with_suffix(".svg").write_text(training)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agent_trainer.rehearsal.learn",
        description="make learn: a GRPO run on CPU through verl's own trainer (tiny local model, real env cluster) "
        "judged on held-out tasks: base policy supervised on the environment's expert (cached), held-out eval "
        "before, GRPO on training tasks, eval after on the merged checkpoint, a supervised control with the same "
        "compute; writes OUT/<env>/seed<S>/summary.json and report.html and OUT/summary.json. Exit 0 when it "
        "learned (held-out success rose, paired 95% interval above 0), 1 when not, 2 on a usage error. "
        "AGENTRL_REHEARSAL_INJECT=reward_zero zeroes the reward before the advantage: it must not learn.",
    )
    parser.add_argument(
        "--env",
        default=os.environ.get("LEARN_ENV") or DEFAULT_ENV,
        choices=sorted(RECIPES),
        help="the environment (default: %(default)s, where the tiny model learns fastest on CPU)",
    )
    parser.add_argument("--seed", type=int, default=0, help="GRPO's seed (data order, rollout sampling)")
    parser.add_argument("--out", type=Path, default=Path("outputs/learn"))
    parser.add_argument(
        "--steps", type=int, default=LearnOptions.steps, help="GRPO steps (default: %(default)s)"
    )
    parser.add_argument("--prompts", type=int, default=LearnOptions.prompts, help="prompts per step")
    parser.add_argument("--rollouts", type=int, default=LearnOptions.rollouts, help="rollouts per prompt")
    parser.add_argument("--lr", type=float, default=LearnOptions.lr, help="the actor's learning rate")
    parser.add_argument(
        "--eval-samples",
        type=int,
        default=LearnOptions.eval_samples,
        help="episodes per held-out task in the judged eval (default: %(default)s)",
    )
    parser.add_argument(
        "--eval-temperature",
        type=float,
        default=LearnOptions.eval_temperature,
        help="the judged eval's temperature (default: %(default)s, the rollout temperature)",
    )
    parser.add_argument(
        "--heldout-split",
        choices=("test", "val"),
        default=LearnOptions.heldout_split,
        help="judge on this split (val while tuning; the test split for the verdict)",
    )
    parser.add_argument(
        "--no-greedy", action="store_true", help="skip the greedy eval reported beside the verdict"
    )
    parser.add_argument("--no-control", action="store_true", help="skip the supervised control")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key (train_tasks, max_plan, sft_steps, layers, hidden, rounds, heldout, "
                        "max_observation_chars, turn_tokens)")  # fmt: skip
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, _, value = item.partition("=")
        if not value:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = int(value) if value.lstrip("-").isdigit() else value
    if min(args.steps, args.prompts, args.rollouts, args.eval_samples) < 1 or args.rollouts < 2:
        parser.error(
            "--steps, --prompts and --eval-samples must be at least 1, --rollouts at least 2 (a GRPO group)"
        )
    options = LearnOptions(env=args.env, seed=args.seed, out_dir=args.out, steps=args.steps, prompts=args.prompts,
                           rollouts=args.rollouts, lr=args.lr, control=not args.no_control, overrides=overrides,
                           eval_samples=args.eval_samples, eval_temperature=args.eval_temperature,
                           heldout_split=args.heldout_split, greedy=not args.no_greedy)  # fmt: skip
    try:
        options.recipe()
    except ValueError as error:
        parser.error(str(error))
    summary = run_learn(options)
    brief = {k: summary.get(k) for k in ("learned", "before", "after", "ci", "p_value", "steps", "seconds", "env",
                                         "verl_version", "seed", "injected", "errors", "report")}  # fmt: skip
    brief["control"] = (summary.get("control") or {}).get("after")
    brief["greedy"] = {
        k: (summary.get("greedy") or {}).get(k, {}).get("success_rate") for k in ("before", "after")
    }
    print(json.dumps(brief, indent=2, default=str))
    if summary["errors"]:
        return 1
    return 0 if summary["learned"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
