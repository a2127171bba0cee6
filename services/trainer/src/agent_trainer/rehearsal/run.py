"""The rehearsal's driver: ``agent-train rehearse`` (``make rehearse VERL_LINE=0.7|0.9 ENV=...``).

1. The run's data, the same way for every environment and mix (``--envs``; default WebShop): per environment its
   training tasks whose expert solves them in at most 4 steps (WebShop's: catalog goals whose oracle plan fits),
   the tiny model warm-started on those experts' episodes rendered through the trainer's spec of each environment
   (:func:`.warm_start.warm_start_tasks`), and the rows, ``agent_trainer.env_data``'s (on 0.7.1 the training rows
   take the interaction route, ToolAgentLoop + the environment's Interaction, where configs/interaction.yaml has
   an entry for it; the validation rows its agent loop; on 0.9.1 the agent loop for both).
2. The env cluster (real replicas behind a real nginx, ``make up-local``'s topology) serving the run's
   environments (``--env ray``: a Ray Serve app serving them instead).
3. ``agent-train train`` with ``make train-test ENV=...``'s config of the line (``<env>_grpo_test``,
   ``mixed_grpo_test``; the project's launcher, verl's entry point and trainer loop), scaled down and on CPU
   (:data:`agent_trainer.rehearsal.SUBSTITUTED`): steps 1 and 2, a checkpoint at step 2; during step 2's rollout
   every env replica is stopped (SIGSTOP) for ``outage_s`` seconds, then resumed.
4. A second invocation, which resumes from the checkpoint and runs step 3.
5. verl's merger on the last checkpoint (``make eval``'s merge step) and the merged model loaded.
6. ``summary.json`` in ``OUT/verl<line>-<env>[+<env>...]/`` (``verl0.7-webshop``, ``verl0.9-textcraft+webshop``):
   what ran, the steps verl logged, the checks; each check replays each
   trajectory in its own environment, and the summary has every environment's figures (``per_env``), from the
   replay and from verl's per-step ``env/<env>/...`` metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import (
    AGENT_LOOP_CONFIG,
    AGENT_LOOP_NAME,
    AGENT_NAME,
    INTERACTION_CONFIG,
    config_dir,
    installed_verl_line,
)
from . import SUBSTITUTED
from .checks import direction_ok
from .device import CPU_SCALE, WRAP_07, override_key, rounds_overrides, seams
from .direction import CATALOG_ENV, FAIL_FAST_ENV, SEQUENCE_FILE, STEPS_FILE, SYNC_FILE, TRAIN_AGENT_ENV
from .direction import ENV as CHECKS_ENV
from .inject import ENV as INJECT_ENV
from .inject import injected
from .warm_start import Gate

#: The test config (configs/webshop_grpo_test.yaml) scaled down to two cores: each Hydra override and why, the
#: device's (:data:`.device.CPU_SCALE`, what every CPU run needs) and the rehearsal's own (what its checks need). The
#: summary's ``substituted`` lists every one of them with the config's own value.
REHEARSAL_SCALE = (
    ("data.max_prompt_length=1024", "the longest first turn is ~780 tokens with the tiny tokenizer"),
    ("data.max_response_length=1024",
     "with pages cut at max_observation_chars, an episode of 4 env steps fits (~700 tokens), so it can end in a purchase"),
    ("actor_rollout_ref.actor.optim.lr=1e-4",
     "a step large enough to show in the tiny model's log-probs (direction and weight-sync checks)"),
    ("+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
     "the actor computes in fp32, not bf16, so its log-probs equal the fp32 rollout's to ~1e-6 (weight-sync check)"),
    ("+actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32", "the reference model as the actor"),
    ("actor_rollout_ref.rollout.temperature=1.3",
     "the warm-started model replays its goals' plans at 1.0 (13 of 14 bought the right product): at 1.3 about half "
     "of the rollouts buy, so a group's env rewards differ"),
    ("trainer.save_freq=2", "a checkpoint at step 2, inside the epoch, to resume from"),
    ("trainer.test_freq=2", "validation at step 2 and at the end"),
    ("trainer.logger=[console,file]", "no TensorBoard"),
)  # fmt: skip
SCALE = tuple(
    item for item in CPU_SCALE if override_key(item[0]) not in {override_key(o) for o, _ in REHEARSAL_SCALE}
) + REHEARSAL_SCALE  # fmt: skip


def scale_value(key: str) -> str:
    """The value :data:`SCALE` sets for ``key``."""
    return next(o.split("=", 1)[1] for o, _ in SCALE if override_key(o) == key)


def warm_gate(turn_tokens: int, env_ids: Sequence[str]) -> Gate:
    """The warm model must earn an env reward in the run's rollouts (sampled at their temperature, n per task, the
    run's per-turn budget and step limit) with a chance of at least 1 - 1e-6 in every environment, or train on until
    it does (warm_start.Gate): env_reward_earned then fails only where the pipe loses what the model can do, whatever
    the machine's floating-point kernels."""
    return Gate(temperature=float(scale_value("actor_rollout_ref.rollout.temperature")),
                rollouts=int(scale_value("actor_rollout_ref.rollout.n")), turn_tokens=turn_tokens,
                max_steps=plan_steps(env_ids))  # fmt: skip


#: Pages cut at this many characters in the rollouts and the warm start (0 in configs/webshop_*.yaml): a WebShop
#: results page is ~600 tokens of the tiny tokenizer, and 4 of them would not fit the response budget.
MAX_OBSERVATION_CHARS = 200
#: A reply without an action costs this much (0.0 in the configs): rewards then differ within a GRPO group even
#: where no rollout of the group buys anything, so the update has advantages of both signs to follow.
INVALID_ACTION_PENALTY = 0.1
EXPERIMENT = "rehearsal"


@dataclass
class RehearsalOptions:
    """What ``agent-train rehearse`` runs (the defaults fit a 2-core machine in a few minutes per line)."""

    out_dir: Path = Path("outputs/rehearsal")
    catalog: Path | None = None
    goals: int = 12  # 3 steps of 4 prompts: the checkpoint at step 2 is inside the epoch
    outage_s: float = 60.0  # every env replica stopped this long during step 2's rollout (0: no outage)
    env: str = "http"  # http: a local cluster (replicas + nginx); ray: the env as a Ray Serve app (ServeEnv)
    turn_tokens: int = 48
    eval_goals: int = 4  # test goals the merged checkpoint plays
    train_further: bool = (
        False  # then resume from step 3 (the epoch's end) with trainer.total_epochs=2: step 4
    )
    fail_fast: bool = False  # a failed trainer-side check ends the run at once (its record says which)
    model_dir: Path | None = (
        None  # the warm-started tiny model (default OUT/tiny_model<label>, shared by both lines)
    )
    envs: tuple[str, ...] = ("webshop",)  # the environments rehearsed (one, or a mix in one run)

    @property
    def label(self) -> str:
        """The run's folder suffix, its environments: ``-webshop``, ``-textcraft``, ``-textcraft+webshop``."""
        return "-" + "+".join(self.envs)


def _line_env(line: str, work: Path, url: str, turn_tokens: int, catalog: Path, fail_fast: bool = False
              ) -> tuple[dict[str, str], list[str]]:  # fmt: skip
    """Environment and Ray overrides that put the CPU seams (:func:`.device.seams`) and the trainer-side checks into
    every process of the run (and a bug a test injects, ``$AGENTRL_REHEARSAL_INJECT``)."""
    shared = {"AGENTRL_URL": url, "AGENTRL_TURN_TOKENS": str(turn_tokens),
              "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"), CHECKS_ENV: str(work), CATALOG_ENV: str(catalog),
              TRAIN_AGENT_ENV: AGENT_NAME if line == "0.7" else AGENT_LOOP_NAME,
              "AGENTRL_INVALID_ACTION_PENALTY": str(INVALID_ACTION_PENALTY), FAIL_FAST_ENV: "1" if fail_fast else "0",
              **({INJECT_ENV: os.environ[INJECT_ENV]} if os.environ.get(INJECT_ENV) else {})}  # fmt: skip
    return seams(line, shared)


def loop_configs(work: Path, max_observation_chars: int) -> dict[str, str]:
    """The agent-loop and interaction configs of the checkout with pages cut at ``max_observation_chars`` (the only
    change), written into ``work``; returns the variables that point the run at them."""
    import yaml

    loops = yaml.safe_load((config_dir() / AGENT_LOOP_CONFIG).read_text())
    for entry in loops:  # every environment's entry (webshop_agent, textcraft_agent, ...)
        if entry.get("name") == AGENT_LOOP_NAME or entry.get("env_id"):
            entry["max_observation_chars"] = max_observation_chars
    interaction = yaml.safe_load((config_dir() / INTERACTION_CONFIG).read_text())
    for entry in interaction["interaction"]:
        entry["config"]["max_observation_chars"] = max_observation_chars
    paths = {
        "AGENTRL_AGENT_LOOP_CONFIG": work / AGENT_LOOP_CONFIG,
        "AGENTRL_INTERACTION_CONFIG": work / INTERACTION_CONFIG,
    }
    paths["AGENTRL_AGENT_LOOP_CONFIG"].write_text(yaml.safe_dump(loops, sort_keys=False))
    paths["AGENTRL_INTERACTION_CONFIG"].write_text(yaml.safe_dump(interaction, sort_keys=False))
    return {k: str(v) for k, v in paths.items()}


def line_config_dir(line: str) -> Path:
    from ..config import VERL09_CONFIG_SUBDIR

    return config_dir() / VERL09_CONFIG_SUBDIR if line == "0.9" else config_dir()


def training_config(line: str, env_ids: Sequence[str]) -> str:
    """The test config ``make train-test ENV=...`` runs on ``line``: ``<env>_grpo_test`` for one environment
    (``webshop_grpo_test``), ``mixed_grpo_test`` for a mix; the WebShop test config where the line has none (its
    data, agent loops and rounds then come from the rehearsal's rows and the specs)."""
    name = f"{env_ids[0]}_grpo_test" if len(env_ids) == 1 else "mixed_grpo_test"
    return name if (line_config_dir(line) / f"{name}.yaml").is_file() else "test"


def substitutions(line: str, turn_tokens: int, env_ids: Sequence[str] = ("webshop",)) -> list[str]:
    """Every way the run differs from ``make train-test``: the stand-ins (:data:`SUBSTITUTED`), each Hydra override
    of the test config with the config's own value, and the settings the rehearsal changes."""
    from omegaconf import OmegaConf

    from ..config import load_training_config, training_config_name

    name = training_config(line, env_ids)
    # the config as composed (its environment's file over the line's base), without verl's defaults: a key the
    # project's files do not set is looked up in verl's own defaults below, and said so
    config = OmegaConf.to_container(
        load_training_config(name, directory=line_config_dir(line), with_verl=False), resolve=False
    )
    listed = list(SUBSTITUTED)
    for override, why in SCALE + tuple(
        (o, "transformers 5: name the FSDP wrap class") for o in WRAP_07 if line == "0.7"
    ):
        key, value = override.lstrip("+").split("=", 1)
        listed.append(f"{key}={value} (make train-test: {_config_value(config, key)}): {why}")
    for override in rounds_overrides(env_ids, plan_steps(env_ids)):
        key, value = override.lstrip("+").split("=", 1)
        listed.append(f"{key}={value} (make train-test: {_config_value(config, key)}): episodes of at most the "
                      "turn limit's env steps (the agent loop and the interaction read the rounds, not verl's limit)")  # fmt: skip
    listed += [
        f"AGENTRL_TURN_TOKENS={turn_tokens} (configs: 512): new tokens per model turn; the warm model answers in ~15",
        f"AGENTRL_INVALID_ACTION_PENALTY={INVALID_ACTION_PENALTY} (configs: 0.0): a reply without an action costs "
        "this much, so a group's rewards differ even without a purchase",
        f"max_observation_chars={MAX_OBSERVATION_CHARS} (configs/agent_loop.yaml, interaction.yaml: 0): "
        "pages cut so that an episode fits the response budget (the rehearsal's copies of both files)",
        "trainer.total_training_steps=2, then 3 on resume (make train-test: 1 epoch of 64 prompts): the run's steps",
    ]
    mix, steps = ",".join(env_ids), plan_steps(env_ids)
    if steps != MAX_PLAN_STEPS:
        listed += [f"{o} (instead of the scale-down's {MAX_PLAN_STEPS + 1}): {steps}-step expert episodes"
                   for o in turn_overrides(env_ids)]  # fmt: skip
    listed += [f"{o} (instead of the scale-down's {scale_value('data.max_prompt_length')}): the longest first turn "
               f"of {mix} ({', '.join(e for e in env_ids if e in PROMPT_TOKENS_OF)})" for o in prompt_overrides(env_ids)]  # fmt: skip
    listed += [
        f"config: {training_config_name(name)} of the line's configs (make train-test ENV={mix})",
        f"data: 12 training tasks (3 steps of 4) and 2 validation tasks of {mix}, interleaved, from each "
        f"environment's training split (WebShop's: goals of the catalog's synthetic goal set, spread over plan "
        f"lengths), all solved by the environment's expert (WebShop's: the catalog's oracle plan) in at most {steps} "
        f"steps, instead of agent-train data --env {mix}'s whole splits",
        f"env: a local cluster (replicas + nginx, make up-local's topology; --env ray: a Ray Serve app) serving {mix} "
        "(AGENTRL_ENVS; WebShop on the run's catalog) instead of the compose stack",
        f"eval: 4 test tasks per environment, at most {steps} steps each (agent-train eval --env {mix} --max-samples "
        f"4 --max-steps {steps}), instead of make eval's whole test split",
    ]
    if line == "0.7":
        listed.append(
            f"0.7.1 training rows: {', '.join(f'{e}: {r}' for e, r in train_routes(line, env_ids).items())}"
        )
    return listed


def interaction_serves(env_id: str) -> bool:
    """Whether configs/interaction.yaml has an entry for ``env_id`` (verl 0.7.1's interaction route)."""
    import yaml

    entries = yaml.safe_load((config_dir() / INTERACTION_CONFIG).read_text()).get("interaction") or []
    return any(entry.get("name") == env_id for entry in entries)


def train_routes(line: str, env_ids: Sequence[str]) -> dict[str, str]:
    """Per environment, the agent loop its training rows name: on 0.7.1 ``tool_agent`` (ToolAgentLoop + the
    environment's Interaction, the line's default) where the interaction config serves it, else its agent loop;
    on 0.9.1 its agent loop (``<env>_agent``)."""
    from .. import envs

    return {
        e: AGENT_NAME if line == "0.7" and interaction_serves(e) else envs.get(e).agent_name for e in env_ids
    }


def _config_value(config: dict[str, Any], key: str) -> str:
    """A dotted key's value in the composed test config (its ``${oc.env:NAME,default}`` shown as ``default ($NAME)``),
    else in verl's own defaults (``verl/trainer/config/_generated_ppo_trainer.yaml``), else "not set"."""
    import re

    import yaml

    def lookup(node: Any) -> Any:
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node

    value = lookup(config)
    source = ""
    if value is _MISSING:
        from importlib.resources import files

        defaults = files("verl.trainer.config").joinpath("_generated_ppo_trainer.yaml")
        value, source = lookup(yaml.safe_load(defaults.read_text())), "verl's default "
    if value is _MISSING:
        return "not set"
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    match = re.search(r"oc\.env:(\w+),([^}]*)}", text)
    return source + (f"{match.group(2)} (${match.group(1)})" if match else text)


_MISSING = object()


#: Env steps an expert episode of the rehearsal may take (the turns' budget: max_assistant_turns 5).
MAX_PLAN_STEPS = 4
#: Environments whose shortest expert episodes are longer: SciWorld's are 5-7 steps at the least (finding a
#: non-living thing, the lifespan tasks; most of its task types take 20-40), so its runs allow 7 (8 turns).
PLAN_STEPS_OF = {"sciworld": 7}
#: Where a rehearsal looks for tasks of an environment whose expert episodes are short, when its training split is
#: mostly long ones (each look at a SciWorld task is a reset and a replay in a JVM: seconds).
SHORT_TASK_TYPES = {
    "sciworld": ("find-non-living-thing", "lifespan-longest-lived", "lifespan-shortest-lived")
}
#: Validation rows of a run.
VAL_TASKS = 2
#: First turns longer than the scale-down's data.max_prompt_length (1024): SciWorld's lifespan tasks list their
#: animals, ~1,100 tokens of the tiny tokenizer. verl drops a longer row, and a run of 12 rows with 3 dropped has 2
#: batches, not 3: its resume at step 2 is then the epoch's end and step 3 never runs.
PROMPT_TOKENS_OF = {"sciworld": 1536}


def plan_steps(env_ids: Sequence[str]) -> int:
    """The longest expert episode a run of ``env_ids`` plays (its turn budget is one more)."""
    return max(PLAN_STEPS_OF.get(env_id, MAX_PLAN_STEPS) for env_id in env_ids)


def rehearsal_candidates(env_id: str) -> list[int]:
    """The training tasks of ``env_id`` the rehearsal looks at, in order: all of them, or where the environment
    has short task types (:data:`SHORT_TASK_TYPES`) those types' tasks."""
    from .. import env_data

    train = env_data.split_tasks(env_id, "train")
    if env_id not in SHORT_TASK_TYPES:
        return train
    from agent_envs.envs.sciworld.games import game

    return [task for task in train if game(task)[0] in SHORT_TASK_TYPES[env_id]]


def turn_overrides(env_ids: Sequence[str]) -> list[str]:
    """The scale-down's turn limits for a run of ``env_ids`` (one more turn than its longest expert episode)."""
    turns = plan_steps(env_ids) + 1
    return [
        f"actor_rollout_ref.rollout.multi_turn.{key}={turns}"
        for key in ("max_assistant_turns", "max_user_turns")
    ]


def _every_row_fits(prepared: dict[str, Any], prompt_override: str) -> None:
    """Stop before verl starts if a row's first turn exceeds the run's prompt budget: verl would drop it without a
    word, and with fewer than 12 rows the run has 2 batches, so its checks fail far from the cause."""
    from ..envs.webshop.data import overlong_first_turns

    limit = int(prompt_override.split("=", 1)[1])
    _, over = overlong_first_turns([prepared["train"], prepared["val"]], str(prepared["model"]), limit)
    if over:
        rows = ", ".join(f"{o['env']} task {o['task']}: {o['tokens']} tokens" for o in over)
        raise RuntimeError(f"{len(over)} rows have a first turn over data.max_prompt_length={limit} ({rows}): "
                           "raise PROMPT_TOKENS_OF for the environment (rehearsal/run.py)")  # fmt: skip


def prompt_overrides(env_ids: Sequence[str]) -> list[str]:
    """The scale-down's prompt budget for a run of ``env_ids`` where one of them has longer first turns
    (:data:`PROMPT_TOKENS_OF`); none where the scale-down's fits."""
    tokens = max((PROMPT_TOKENS_OF.get(env_id, 0) for env_id in env_ids), default=0)
    return [f"data.max_prompt_length={tokens}"] if tokens > int(scale_value("data.max_prompt_length")) else []


def _prepare(options: RehearsalOptions, work: Path, line: str) -> dict[str, Any]:
    """The run's environments (one or a mix, WebShop's as any other's): per environment the training tasks its
    expert solves in at most :data:`MAX_PLAN_STEPS` steps (the run's share of ``options.goals``, interleaved, and
    the validation tasks; WebShop's: goals whose oracle plan fits, spread over plan lengths), the tiny model
    warm-started on those experts' episodes, the rows (``env_data.RowBuilder``, as ``agent-train data`` builds
    them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agent_envs.envs.webshop.catalog.store import open_catalog

    from .. import env_data, envs
    from ..harness.catalog import default_catalog
    from ..harness.tasks import pick_oracle_goals
    from ..tiny_model import build_tiny_model
    from .warm_start import recipe_stale, solvable_tasks, tasks_recipe, warm_start_tasks

    env_ids = list(options.envs)
    catalog = (options.catalog or default_catalog(work)).resolve()
    cap = MAX_OBSERVATION_CHARS
    share = {e: options.goals // len(env_ids) + (1 if k < options.goals % len(env_ids) else 0)
             for k, e in enumerate(env_ids)}  # fmt: skip
    val = {
        e: VAL_TASKS // len(env_ids) + (1 if k < VAL_TASKS % len(env_ids) else 0)
        for k, e in enumerate(env_ids)
    }
    tasks: dict[str, list[int]] = {}
    for env_id in env_ids:
        need = share[env_id] + val[env_id]
        if envs.get(env_id).needs_catalog:
            picked = sorted(
                pick_oracle_goals(catalog, "synthetic", "train", need, max_turns=MAX_PLAN_STEPS + 1)
            )
        else:
            steps = PLAN_STEPS_OF.get(env_id, MAX_PLAN_STEPS)
            picked = solvable_tasks(
                env_id, rehearsal_candidates(env_id), need, steps, max_observation_chars=cap
            )
        if len(picked) < need:
            raise RuntimeError(f"{env_id}: only {len(picked)} training tasks whose expert solves them in "
                               f"{PLAN_STEPS_OF.get(env_id, MAX_PLAN_STEPS)} steps (need {need})")  # fmt: skip
        tasks[env_id] = picked[:need]
    model_dir = (options.model_dir or options.out_dir / f"tiny_model{options.label}").resolve()
    gate = warm_gate(options.turn_tokens, env_ids)
    recipe = tasks_recipe(tasks, 1500, 3e-3, 0, cap, gate)
    model = build_tiny_model(model_dir, catalog, force=recipe_stale(model_dir, recipe))
    warmed = warm_start_tasks(model, tasks, 1500, max_observation_chars=cap, catalog_dir=catalog, gate=gate)
    first = env_ids[0]
    write_fixed_sequence(model, catalog, tasks[first][0], work / SEQUENCE_FILE, cap, env_id=first)
    routes = train_routes(line, env_ids)
    opened = open_catalog(catalog) if any(envs.get(e).needs_catalog for e in env_ids) else None
    builders = {e: env_data.RowBuilder(e, opened) for e in env_ids}
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, counts, offset in (("train", share, 0), ("val", val, None)):
        order = env_data.weighted_order({e: c for e, c in counts.items() if c}, dict.fromkeys(env_ids, 1.0))
        taken = dict.fromkeys(env_ids, 0)
        rows = []
        for index, env_id in enumerate(order):
            position = taken[env_id] + (0 if offset is not None else share[env_id])
            row = builders[env_id].row(tasks[env_id][position], "train", index)
            if (
                split == "train"
            ):  # 0.7.1: the interaction route where there is one; the validation rows: agent loops
                row["agent_name"] = routes[env_id]
            rows.append(row)
            taken[env_id] += 1
        path = data / f"{split}_{'+'.join(env_ids)}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=env_data.SCHEMA), path)
        files[split] = str(path)
    return {"catalog": catalog, "fingerprint": open_catalog(catalog).fingerprint, "model": model,
            "warm_start": warmed, "tasks": tasks, "routes": routes, **files}  # fmt: skip


def write_fixed_sequence(model: Path, catalog: Path, task: int, path: Path, cap: int, prompt_tokens: int = 64,
                         response_tokens: int = 512, env_id: str = "webshop") -> None:  # fmt: skip
    """The sequence whose log-probs the weight-sync check compares (rollout against actor) after every sync: the
    expert's whole episode of ``task`` of ``env_id`` as the agent loop renders it, its first ``prompt_tokens``
    tokens as the prompt and up to ``response_tokens`` more as the scored response (pages and replies alike: a
    probe, not a turn)."""
    from transformers import AutoTokenizer

    from .warm_start import expert_examples

    tokenizer = AutoTokenizer.from_pretrained(model)
    messages, reply = expert_examples({env_id: [task]}, catalog_dir=catalog, max_observation_chars=cap)[-1]
    ids = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": reply}], tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    path.write_text(json.dumps({"prompt_ids": ids[:prompt_tokens],
                                "response_ids": ids[prompt_tokens : prompt_tokens + response_tokens]}))  # fmt: skip


class Outage:
    """Stops every env replica (SIGSTOP) as soon as the run has logged its first step (the trainer then starts
    step 2 with its rollout), for ``seconds``, then resumes them (SIGCONT); the moments are recorded for the
    summary. ``signal_replicas(sig)`` reaches the replicas: the local cluster's process groups, or the Serve
    replica actors of a Ray head (Serve's health check replaces a stopped one: the outage ends sooner there)."""

    def __init__(
        self, signal_replicas: Callable[[signal.Signals], None], metrics: Path, seconds: float
    ) -> None:
        self._signal, self.metrics, self.seconds = signal_replicas, metrics, seconds
        self.started: float | None = None
        self.ended: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Outage:
        if self.seconds > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.seconds + 10)
        self._signal(signal.SIGCONT)  # never leave a replica stopped

    def _watch(self) -> None:
        # verl's file logger writes each step's line unbuffered, right before the next step's rollout begins
        while not self._stop.is_set() and not any(row["step"] >= 1 for row in _metrics(self.metrics)):
            time.sleep(0.1)
        if self._stop.is_set():
            return
        self._signal(signal.SIGSTOP)
        self.started = time.time()
        print(f"[rehearsal] env outage: every env replica stopped for {self.seconds:.0f} s", flush=True)
        self._stop.wait(self.seconds)
        self._signal(signal.SIGCONT)
        self.ended = time.time()
        print(
            f"[rehearsal] env outage over after {self.ended - self.started:.0f} s: replicas resumed",
            flush=True,
        )


def cluster_replicas(cluster_dir: Path) -> Callable[[signal.Signals], None]:
    """Signal the local cluster's replicas (each one's process group: its uvicorn workers too)."""

    def send(sig: signal.Signals) -> None:
        record = json.loads((cluster_dir / "pids.json").read_text())
        for replica in record.get("replicas", []):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(replica["pgid"]), sig)

    return send


def serve_replicas(head: Any) -> Callable[[signal.Signals], None]:
    """Signal the Serve replica actors (``ray::ServeReplica:...``) of a ``LocalRayHead``."""

    def send(sig: signal.Signals) -> None:
        for pid in head.session_pids():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ServeReplica"):
                    os.kill(pid, sig)

    return send


class ServeEnv:
    """``--env ray``: ``make up-ray``'s one-node Ray cluster (``agent_envs.ray_serve.local``, in ``run_dir``),
    with 16 CPUs and 2 declared GPUs (what the rehearsal's local cluster has) and the run's environments
    (``env_ids``) deployed on it by ``agent-envs serve-ray --envs``; verl's trainer joins that cluster
    (``RAY_ADDRESS``) and reaches the env through ``AGENTRL_ENV=ray``."""

    def __init__(self, catalog: Path, run_dir: Path, env_ids: Sequence[str]) -> None:
        from agent_envs import cluster

        self.catalog, self.run_dir, self.envs = catalog, run_dir, ",".join(env_ids)
        self.port = cluster.free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.record: dict[str, Any] = {}

    def start(self) -> None:
        from agent_envs.ray_serve import local

        self.record = local.up(
            self.run_dir,
            self.catalog,
            self.port,
            replicas_per_node=2,
            cpus=16,
            gpus=2,
            extra=("--envs", self.envs),
        )

    def head(self) -> Any:
        from agent_envs.ray_serve import local

        return local.head_of(self.record)

    def env(self) -> dict[str, str]:
        """What the launcher needs: the one setting, the cluster, and serve-ray's own arguments (it checks the
        app; the same catalog, replicas and environments leave it as it is)."""
        return {"AGENTRL_ENV": "ray", "AGENTRL_RAY_PORT": str(self.port), "RAY_ADDRESS": self.record["address"],
                "WEBSHOP_CATALOG": str(self.catalog), "AGENTRL_RAY_REPLICAS_PER_NODE": "2",
                "AGENTRL_ENVS": self.envs, "AGENTRL_URL": DEAD_URL}  # fmt: skip

    def stop(self) -> None:
        from agent_envs.ray_serve import local

        local.down(self.run_dir)


#: ``--env ray``'s AGENTRL_URL: nothing may reach the env another way (a request there is refused at once).
DEAD_URL = "http://127.0.0.1:9"
#: With ``--env ray`` verl joins a running cluster: ``ray.init`` then refuses resource and dashboard arguments.
JOINED_CLUSTER = {
    "ray_kwargs.ray_init.num_cpus=16": "ray_kwargs.ray_init.num_cpus=null",
    "+ray_kwargs.ray_init.num_gpus=2": None,
    "+ray_kwargs.ray_init.include_dashboard=false": None,
}


def _train(work: Path, steps: int, overrides: list[str], env: dict[str, str], log: Path, config: str = "test"
           ) -> int:  # fmt: skip
    """``agent-train train --config <config>`` (the user's launcher) up to ``steps`` training steps."""
    command = [sys.executable, "-m", "agent_trainer.cli", "train", "--config", config, "--experiment", EXPERIMENT,
               "--output-dir", str(work / "runs"), *overrides, f"trainer.total_training_steps={steps}"]  # fmt: skip
    before = log.stat().st_size if log.exists() else 0
    code = _run_trainer(command, env, log, work, timeout=1800)
    if code != 0 and RAY_START_TIMEOUT in log.read_bytes()[before:].decode(errors="replace"):
        # Ray gives its own node 30 s to register (hard-coded); a saturated machine can miss that before anything
        # of the run started: once more (verl resumes from whatever checkpoint there is)
        code = _run_trainer(command, env, log, work, timeout=1800)
    return code


#: What ``ray.init`` raises when its node did not register in time (nothing of the run has started yet).
RAY_START_TIMEOUT = "The current node timed out during startup"


def _run_trainer(command: list[str], env: dict[str, str], log: Path, cwd: Path, timeout: float) -> int:
    """Run a ``agent-train`` command with the run's environment, its output appended to the rehearsal log."""
    with open(log, "ab") as out:
        out.write(f"\n[rehearsal] {' '.join(command)}\n".encode())
        out.flush()
        return subprocess.run(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                              timeout=timeout).returncode  # fmt: skip


def _metrics(path: Path) -> list[dict[str, Any]]:
    """verl's file logger: one JSON line per step ({"step": N, "data": {...}})."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if "step" in row:
                rows.append({"step": int(row["step"]), **row.get("data", {})})
    return rows


def _all_metrics(directory: Path) -> list[dict[str, Any]]:
    """Every invocation's steps (``agent-train train`` keeps the earlier files next to the current one)."""
    rows = [row for path in sorted(directory.glob("metrics*.jsonl")) for row in _metrics(path)]
    return sorted(rows, key=lambda row: row["step"])


def _evaluate(work: Path, checkpoint: Path, url: str, env: dict[str, str], log: Path, goals: int,
              env_ids: Sequence[str] = ("webshop",)) -> dict[str, Any]:  # fmt: skip
    """``agent-train eval --policy checkpoint --server cpu --env <envs>`` on each environment's first test tasks;
    its metrics.json (per environment of a mix: ``per_env``)."""
    out = work / "eval"
    command = [sys.executable, "-m", "agent_trainer.cli", "eval", "--policy", "checkpoint", "--server", "cpu",
               "--model-path", str(checkpoint), "--url", url, "--split", "test", "--max-samples", str(goals),
               "--max-steps", str(plan_steps(env_ids)), "--out", str(out), "--overwrite", "--no-progress",
               "--startup-timeout", "300", "--env", ",".join(env_ids)]  # fmt: skip
    code = _run_trainer(command, env, log, work, timeout=900)
    metrics = out / "metrics.json"
    if code != 0 or not metrics.exists():
        raise RuntimeError(f"agent-train eval of {checkpoint} failed (exit {code}); see {log}")
    data = json.loads(metrics.read_text())
    if len(env_ids) == 1:
        return {"episodes": data.get("episodes"), "score": data.get("score"),
                "success_rate": data.get("success_rate"), "out": str(out)}  # fmt: skip
    per_env = {}
    for env_id in env_ids:
        path = out / env_id / "metrics.json"
        each = json.loads(path.read_text()) if path.exists() else {}
        per_env[env_id] = {"episodes": each.get("episodes"), "success_rate": each.get("success_rate"),
                           "mean_reward": each.get("mean_reward")}  # fmt: skip
    return {"episodes": sum(int(e["episodes"] or 0) for e in per_env.values()), "per_env": per_env,
            "out": str(out)}  # fmt: skip


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def per_env_figures(records: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]],
                    env_ids: Sequence[str]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per environment: the replayed env reward, success rate and steps over the training steps (the checks'
    records, ``envs``), and the means over the training steps of verl's logged ``env/<env>/...`` metrics
    (``logged``: reward_mean, success_rate, steps_mean, invalid_rate, score_mean) with the steps that had them."""
    from ..verl_main import ENV_METRIC_PREFIX, ENV_METRICS

    out: dict[str, dict[str, Any]] = {}
    for env_id in env_ids:
        replayed = [r["envs"][env_id] for r in records if env_id in (r.get("envs") or {})]

        def mean(key: str, rows: Sequence[Mapping[str, Any]] = replayed) -> float | None:
            values = [row[key] for row in rows if row.get(key) is not None]
            return sum(values) / len(values) if values else None

        train_steps = [row for row in steps if row["step"] >= 1]
        logged = {}
        for name, _ in ENV_METRICS:
            key = f"{ENV_METRIC_PREFIX}/{env_id}/{name}"
            values = [float(row[key]) for row in train_steps if row.get(key) is not None]
            logged[name] = sum(values) / len(values) if values else None
        logged["steps_logged"] = sorted({row["step"] for row in train_steps
                                         if f"{ENV_METRIC_PREFIX}/{env_id}/reward_mean" in row})  # fmt: skip
        out[env_id] = {"trajectories": sum(r["trajectories"] for r in replayed),
                       "env_reward_mean": mean("env_reward_mean"), "success_rate": mean("success_rate"),
                       "steps_mean": mean("steps_mean"), "logged": logged}  # fmt: skip
    return out


def judge(work: Path, steps: Sequence[int], resumed_from: int | None, env_ids: Sequence[str] = ("webshop",),
          logged: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:  # fmt: skip
    """The trainer-side checks' records (``steps.jsonl``, ``sync.jsonl`` in ``work``) judged: ``checks`` (each a
    bool) and the figures the summary reports (``per_env``: :func:`per_env_figures` with verl's ``logged``
    steps). ``env_reward_earned`` holds when every environment of the run earned an env reward."""
    records = _records(work / STEPS_FILE)
    syncs = _records(work / SYNC_FILE)
    seen = {r["step"] for r in records}
    direction = [r["direction"] for r in records]
    env_rewards = [
        r["reward"]["env_reward_mean"] for r in records if r["reward"]["env_reward_mean"] is not None
    ]
    per_env = per_env_figures(records, logged, env_ids)
    synced = {s["global_steps"] for s in syncs}
    expected_syncs = {0, *steps, *([resumed_from] if resumed_from is not None else [])}
    found = {
        # the loss covers exactly the model's own tokens (env pages, separators never trained on)
        "loss_mask_is_model_tokens": seen >= set(steps) and all(r["mask"]["ok"] for r in records),
        # the reward the trainer used is the env's own for the actions taken (replayed), less the declared penalty
        "reward_matches_env": seen >= set(steps) and all(r["reward"]["ok"] for r in records),
        # judged against the env's reward, on the loss tokens, in every step with non-zero advantages
        "update_direction": seen >= set(steps) and direction_ok(direction),
        # after every sync the rollout holds the actor's weights: all names, a new load, equal log-probs
        "weight_sync": expected_syncs <= synced and all(s["ok"] for s in syncs),
        # the episodes fit their budget: every environment's episodes earn an env reward (WebShop: a purchase)
        "env_reward_earned": bool(env_rewards)
        and sum(env_rewards) / len(env_rewards) > 0
        and all((figures["env_reward_mean"] or 0) > 0 for figures in per_env.values()),
    }
    failed = [name for name, bad in (
        ("loss_mask_is_model_tokens", any(not r["mask"]["ok"] for r in records)),
        ("reward_matches_env", any(not r["reward"]["ok"] for r in records)),
        ("update_direction", any(d.get("informative") and not d["right_way"] for d in direction)),
        ("weight_sync", any(not s["ok"] for s in syncs))) if bad]  # fmt: skip
    return {"checks": found, "failed_checks": failed, "per_env": per_env,
            "env_reward_mean": sum(env_rewards) / len(env_rewards) if env_rewards else None,
            "per_step": [{"step": r["step"], "env_reward_mean": r["reward"]["env_reward_mean"],
                          "purchases_with_reward": r["reward"]["purchases_with_reward"],
                          "envs": r.get("envs"),
                          "reward_max_abs_diff": r["reward"]["max_abs_diff"],
                          "env_tokens_in_loss": r["mask"]["env_tokens_in_loss"],
                          "model_tokens_outside_loss": r["mask"]["model_tokens_outside_loss"],
                          "direction": {k: r["direction"][k] for k in ("informative", "right_way", "weighted_change",
                                                                       "positive_mean_change", "negative_mean_change",
                                                                       "pipe_advantage_signs_disagree")}}
                         for r in records],
            "syncs": [{"sync": s["sync"], "global_steps": s["global_steps"], "ok": s["ok"],
                       "max_abs_diff": max((r["max_abs_diff"] for r in s["replicas"] if r["max_abs_diff"] is not None),
                                           default=None),
                       "missing": sorted({n for r in s["replicas"] for n in r["missing"]}),
                       "unknown": sorted({n for r in s["replicas"] for n in r["unknown"]}),
                       "loaded": all(r["loaded"] for r in s["replicas"])} for s in syncs],
            "step_records": records}  # fmt: skip


def run_rehearsal(options: RehearsalOptions) -> dict[str, Any]:
    """The whole rehearsal for the installed verl line; returns (and writes) the summary."""
    from importlib.metadata import version

    from agent_envs import cluster

    from ..evaluation.model_path import resolve_model_path
    from ..harness.cluster import start_cluster

    started = time.monotonic()
    line = installed_verl_line()
    env_ids = tuple(options.envs)
    config_name = training_config(line, env_ids)
    work = (options.out_dir / f"verl{line}{options.label}").resolve()
    shutil.rmtree(work / "runs", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "rehearsal.log"
    log.write_text("")
    for name in (STEPS_FILE, SYNC_FILE, "direction.jsonl"):
        (work / name).unlink(missing_ok=True)
    summary: dict[str, Any] = {"ok": False, "verl_version": version("verl"), "verl_line": line,
                               "injected": injected(), "steps_completed": 0, "resumed_from_step": None,
                               "checkpoint": None, "merged_model": None, "eval_episodes": 0,
                               "env_outage_survived": False, "update_direction_ok": False, "env_reward_mean": None,
                               "substituted": substitutions(line, options.turn_tokens, env_ids), "errors": [],
                               "checks": {}, "log": str(log), "envs": list(env_ids), "config": config_name}  # fmt: skip
    errors, checks = summary["errors"], summary["checks"]
    stop = None
    try:
        prepared = _prepare(options, work, line)
        summary["catalog"] = {"dir": str(prepared["catalog"]), "fingerprint": prepared["fingerprint"]}
        summary["warm_start"] = prepared["warm_start"]
        summary["tasks"], summary["train_routes"] = prepared["tasks"], prepared["routes"]
        if options.env == "ray":  # a Ray Serve app serving the run's environments
            serve = ServeEnv(prepared["catalog"], work / "ray", env_ids)
            stop = serve.stop
            serve.start()
            url, replicas = serve.url, serve_replicas(serve.head())
        else:  # a local cluster serving exactly the run's environments
            running = start_cluster(prepared["catalog"], work / "cluster", served=env_ids)
            stop = running.stop
            url, replicas = running.url, cluster_replicas(work / "cluster")
        summary["env"] = options.env
        env, ray = _line_env(line, work, url if options.env == "http" else DEAD_URL, options.turn_tokens,
                             prepared["catalog"], options.fail_fast)  # fmt: skip
        if options.env == "ray":
            env.update(serve.env())
        env.update(loop_configs(work, MAX_OBSERVATION_CHARS))
        env_limits = {override_key(o): o for o in [*turn_overrides(env_ids), *prompt_overrides(env_ids)]}
        scale = [env_limits.get(override_key(o), o) for o, _ in SCALE]
        scale = [JOINED_CLUSTER.get(o, o) for o in scale] if options.env == "ray" else scale
        _every_row_fits(prepared, next(o for o in scale if o and override_key(o) == "data.max_prompt_length"))
        overrides = [*(o for o in scale if o is not None), *rounds_overrides(env_ids, plan_steps(env_ids)),
                     *(WRAP_07 if line == "0.7" else ()), *ray,
                     f"actor_rollout_ref.model.path={prepared['model']}",
                     f"data.train_files={prepared['train']}", f"data.val_files={prepared['val']}",
                     f"data.train_max_samples={options.goals}"]  # fmt: skip
        run = work / "runs" / EXPERIMENT
        checkpoints = run / "checkpoints"
        overrides.append(f"trainer.default_local_dir={checkpoints}")

        # first invocation: steps 1-2, the outage during step 2's rollout, a checkpoint at step 2
        with Outage(replicas, run / "metrics" / "metrics.jsonl", options.outage_s) as outage:
            first = _train(work, 2, overrides, env, log, config_name)
        if first != 0:
            raise RuntimeError(f"the first training invocation failed (exit {first}); see {log}")
        marker = checkpoints / "latest_checkpointed_iteration.txt"
        saved = int(marker.read_text().strip()) if marker.exists() else None
        checks["checkpoint_at_step_2"] = saved == 2 and (checkpoints / "global_step_2").is_dir()
        summary["env_outage"] = {"seconds": round(outage.ended - outage.started, 1)} if outage.ended else None
        checks["env_outage_happened"] = options.outage_s <= 0 or outage.ended is not None

        # second invocation: resumes from the checkpoint, step 3
        second = _train(work, 3, overrides, env, log, config_name)
        if second != 0:
            raise RuntimeError(f"the resumed training invocation failed (exit {second}); see {log}")
        summary["resumed_from_step"] = saved
        steps = _all_metrics(run / "metrics")
        summary["steps"] = steps
        summary["steps_completed"] = len({row["step"] for row in steps if row["step"] >= 1})  # 0: validation
        checks["three_steps"] = {row["step"] for row in steps} >= {1, 2, 3}
        resumed_log = log.read_text(errors="replace").split("trainer.total_training_steps=3", 1)[-1]
        checks["resumed"] = f"global_step_{saved}" in resumed_log and (
            "Resuming from" in resumed_log or "Load from checkpoint" in resumed_log
        )
        last = checkpoints / "global_step_3"
        checks["checkpoint_at_step_3"] = last.is_dir()
        summary["checkpoint"] = str(last)
        summary["env_outage_survived"] = checks["env_outage_happened"] and checks["three_steps"]
        if (
            options.train_further
        ):  # "train it further": a second epoch, resumed from the first one's end (step 3)
            further = _train(work, 4, [*overrides, "trainer.total_epochs=2", "trainer.val_before_train=false"], env,
                             log, config_name)  # fmt: skip
            if further != 0:
                raise RuntimeError(
                    f"the invocation with trainer.total_epochs=2 failed (exit {further}); see {log}"
                )
            checks["train_further_trained_step_4"] = any(
                r["step"] == 4 for r in _all_metrics(run / "metrics")
            )
        trained = (1, 2, 3, 4) if options.train_further else (1, 2, 3)
        logged = _all_metrics(run / "metrics")
        judged = judge(work, steps=trained, resumed_from=saved, env_ids=env_ids, logged=logged)
        checks.update(judged.pop("checks"))
        # verl's own per-step metrics carry every environment's figures at every training step (verl_main)
        checks["env_step_metrics"] = all(set(trained) <= set(judged["per_env"][e]["logged"]["steps_logged"])
                                         for e in env_ids)  # fmt: skip
        summary.update(judged)
        summary["update_direction_ok"] = checks["update_direction"]

        # verl's merger on the last checkpoint, and the merged model loads
        merged = resolve_model_path(last)
        summary["merged_model"] = merged.serve
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(merged.serve)
        checks["merged_model_loads"] = True

        # eval of that checkpoint: `agent-train eval --policy checkpoint`, served on CPU instead of by sglang
        evaluated = _evaluate(work, last, url, env, log, options.eval_goals, env_ids)
        summary["eval"] = evaluated
        summary["eval_episodes"] = int(evaluated.get("episodes") or 0)
        checks["eval"] = summary["eval_episodes"] == options.eval_goals * len(env_ids)
    except Exception as error:  # every failure goes into the summary
        errors.append(f"{type(error).__name__}: {error}")
        if "update_direction" not in checks:  # what the trainer-side checks recorded before the failure
            judged = judge(work, steps=(1, 2, 3), resumed_from=2, env_ids=env_ids)
            checks.update({name: False for name in judged.pop("checks") if name in judged["failed_checks"]})
            summary.update(judged)
    finally:
        if stop is not None:
            stop()
        cluster.down(work / "cluster", quiet=True)
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["ok"] = not errors and bool(checks) and all(checks.values())
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    summary["summary_path"] = str(work / "summary.json")
    return summary
