"""TRL's GRPOTrainer on the served environments, through their OpenEnv face (``/<env>/openenv``), on CPU.

One environment or a mix (``--envs textcraft,babyai,webshop``): each episode is played by OpenEnv's own client
(``GenericEnvClient``, a WebSocket session through the balancer) and the model being trained, turn by turn, in
TRL's ``rollout_func``. What the model sees and how its replies become actions are the trainer's environment specs
(``agent_trainer.envs``: system prompt, first message, parser, step message, outcome), the same definitions verl's
agent loop uses, so a model trained here and one trained through verl see one format.

- the data: a row per (environment, training task) (``agent_trainer.env_data.split_tasks``, the verl path's
  splits), its prompt the spec's system prompt and first message of the task's reset (over OpenEnv's HTTP route);
  rows interleaved by environment, so every step's batch holds each environment (``--per-env`` prompts of each);
- a rollout: reset the task over a WebSocket session, then up to ``--max-turns`` model turns (at most
  ``--turn-tokens`` tokens each); each reply parsed by the spec and stepped, the spec's step message appended as the
  next user turn. The completion is every turn's tokens; the environment's are masked out of the loss (``env_mask``);
- the reward: the episode's reward as the spec reads it (``Outcome.env_reward``, less the invalid-reply penalty of
  ``agent_trainer.config.InteractionSettings``), logged per environment at every step (``env/<id>/reward``,
  ``env/<id>/success``) and written to ``<out>/summary.json``.

The model: a local directory (``--model``), or by default the trainer's tiny random-weight model built here
(``agent_trainer.tiny_model``, no download). Run it with ``make train-trl`` (docs/trl.md), which starts the fleet.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16: we know

from openenv import GenericEnvClient

from agent_trainer import envs
from agent_trainer.config import InteractionSettings
from agent_trainer.envs.spec import EnvSpec, Outcome, Parsed


# ---- the environments, through OpenEnv ---------------------------------------------------------------------------
def answer_of(payload: Any) -> dict[str, Any]:
    """An OpenEnv answer (a ``StepResult``, or its JSON over HTTP) as the spec reads an environment's answer: the
    observation's text, reward and end, and the environment's ``info`` (WebShop: instruction, actions, validity) both
    at the top, as the native protocol has them, and under ``info``."""
    if isinstance(payload, dict):
        observation, reward, done = (
            payload.get("observation") or {},
            payload.get("reward"),
            payload.get("done"),
        )
    else:
        observation, reward, done = payload.observation or {}, payload.reward, payload.done
    info = dict(observation.get("info") or {})
    return {**info, "observation": observation.get("text", ""), "reward": float(reward or 0.0),
            "done": bool(done), "info": info, "state": observation.get("state")}  # fmt: skip


def train_tasks(env_id: str, count: int, catalog: str | None, seed: int) -> list[int]:
    """``count`` of the environment's training tasks (the verl path's split), drawn with ``seed``."""
    from agent_trainer import env_data

    if env_id == envs.WEBSHOP:
        from agent_envs.envs.webshop.catalog.store import open_catalog

        if catalog is None:
            raise SystemExit("webshop needs --catalog (its training goals come from the prepared catalog)")
        tasks = env_data.split_tasks(env_id, "train", catalog=open_catalog(catalog))
    else:
        tasks = env_data.split_tasks(env_id, "train")
    return random.Random(f"{seed}:{env_id}").sample(tasks, min(count, len(tasks)))


def first_prompt(url: str, spec: EnvSpec, task: int) -> list[dict[str, str]]:
    """The conversation a task starts with: the spec's system prompt and its first message of the reset."""
    import requests

    reply = requests.post(f"{url}/{spec.env_id}/openenv/reset", json={"task": task}, timeout=120)
    reply.raise_for_status()
    return [{"role": "system", "content": spec.system_prompt},
            {"role": "user", "content": spec.first_message(answer_of(reply.json()))}]  # fmt: skip


def build_rows(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, tuple[str, int]]]:
    """The dataset (interleaved by environment) and each prompt's (environment, task)."""
    per_env = {env_id: train_tasks(env_id, args.tasks, args.catalog, args.seed) for env_id in args.envs}
    rows, where = [], {}
    for index in range(args.tasks):
        for env_id in args.envs:
            if index < len(per_env[env_id]):
                task = per_env[env_id][index]
                prompt = first_prompt(args.url, envs.get(env_id), task)
                where.setdefault(json.dumps(prompt), (env_id, task))
                rows.append({"prompt": prompt, "env": env_id, "task": task})
    return rows, where


# ---- a rollout: the model plays an episode, turn by turn ---------------------------------------------------------
class Turns:
    """Token pieces of a conversation in the model's chat template: where a reply ends, and a user turn with the
    assistant's header after it (both from the template itself, so any chat model's template works)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        marker = "\x00REPLY\x00"
        base = [{"role": "user", "content": "x"}]
        closed = tokenizer.apply_chat_template(
            [*base, {"role": "assistant", "content": marker}], tokenize=False
        )
        self.reply_end = closed[closed.index(marker) + len(marker) :]  # e.g. "<|im_end|>\n"
        self._base = closed
        self._base_messages = [*base, {"role": "assistant", "content": marker}]
        self.eos_text = (
            tokenizer.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else ""
        )

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return self.ids(
            self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )

    def close_reply(self, reply_ids: list[int]) -> list[int]:
        """What closes a reply in the template: the rest of the end after the eos the model stopped on, or all."""
        stopped = bool(reply_ids) and reply_ids[-1] == self.tokenizer.eos_token_id
        end = self.reply_end[len(self.eos_text):] if stopped and self.reply_end.startswith(self.eos_text) else (
            self.reply_end)  # fmt: skip
        return self.ids(end) if end else []

    def user_turn(self, content: str) -> list[int]:
        """A user turn and the assistant's header, as the template renders them after a closed reply."""
        full = self.tokenizer.apply_chat_template(
            [*self._base_messages, {"role": "user", "content": content}],
            tokenize=False,
            add_generation_prompt=True,
        )
        assert full.startswith(self._base), "the chat template does not render a conversation as a prefix"
        return self.ids(full[len(self._base) :])


def play(
    args: argparse.Namespace,
    spec: EnvSpec,
    task: int,
    prompt: list[dict[str, str]],
    turns: Turns,
    generate: Any,
) -> dict[str, Any]:
    """One episode of ``spec``'s environment over an OpenEnv WebSocket session, the model replying."""
    settings = InteractionSettings()
    prompt_ids = turns.prompt(prompt)
    completion: list[int] = []
    mask: list[int] = []
    reward, penalty, success, steps = 0.0, 0.0, False, 0
    with GenericEnvClient(base_url=f"{args.url}/{spec.env_id}/openenv").sync() as client:
        client.reset(task=task)
        for turn in range(min(args.max_turns, spec.max_rounds or args.max_turns)):
            reply_ids = generate(prompt_ids + completion)
            completion += reply_ids
            mask += [1] * len(reply_ids)
            reply = turns.tokenizer.decode(reply_ids, skip_special_tokens=True)
            parsed: Parsed = spec.parse(reply)
            if args.show:
                print(
                    f"  [{spec.env_id} {task} turn {turn}] reply {reply[:120]!r} -> action {parsed.action!r}"
                )
            if (
                parsed.action is None
            ):  # the client answers the reply itself (AgentGym's format: several actions)
                answer, outcome = {}, Outcome.not_sent()
            else:
                answer = answer_of(client.step({"action": parsed.action}))
                outcome = spec.outcome(answer, parsed)
                reward, success, steps = outcome.env_reward, outcome.success, steps + 1
            penalty += 0.0 if parsed.well_formed else settings.invalid_action_penalty
            end = turns.close_reply(reply_ids)
            completion += end
            mask += [0] * len(end)
            if outcome.done or turn == args.max_turns - 1:
                break
            message = spec.step_message(answer, parsed, outcome, settings.max_observation_chars)
            user = turns.user_turn(message)
            completion += user
            mask += [0] * len(user)
    return {"prompt_ids": prompt_ids, "completion_ids": completion, "env_mask": mask, "env_reward": reward - penalty,
            "env_success": float(success), "env_steps": steps}  # fmt: skip


def make_rollout(args: argparse.Namespace, where: dict[str, tuple[str, int]]) -> Any:
    """TRL's ``rollout_func``: each prompt's episode, the model of the trainer generating on its device."""
    turns_of: dict[int, Turns] = {}

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        import copy

        import torch
        from trl.models import unwrap_model_for_generation

        tokenizer = trainer.processing_class
        turns = turns_of.setdefault(id(tokenizer), Turns(tokenizer))
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = args.turn_tokens
        device = trainer.accelerator.device
        out: dict[str, list[Any]] = defaultdict(list)
        with (
            unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model,
            torch.no_grad(),
        ):

            def generate(ids: list[int]) -> list[int]:
                inputs = torch.tensor([ids], device=device)
                made = model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                                      generation_config=config)[0, len(ids):].tolist()  # fmt: skip
                if tokenizer.eos_token_id in made:
                    made = made[: made.index(tokenizer.eos_token_id) + 1]
                return made

            for prompt in prompts:
                env_id, task = where[json.dumps(prompt)]
                episode = play(args, envs.get(env_id), task, prompt, turns, generate)
                for key, value in episode.items():
                    out[key].append(value)
                out["episode_env"].append(env_id)
        out["logprobs"] = None  # type: ignore[assignment]  # recomputed by the trainer (no vLLM)
        return dict(out)

    return rollout


def env_reward(
    completions: list[Any], env_reward: list[float], env_success: list[float], episode_env: list[str],
    log_metric: Any = None, **_: Any,
) -> list[float]:  # fmt: skip
    """The episode's reward (the spec's), logged per environment."""
    if log_metric is not None:
        for env_id in sorted(set(episode_env)):
            mine = [i for i, e in enumerate(episode_env) if e == env_id]
            log_metric(f"env/{env_id}/reward", statistics.fmean(env_reward[i] for i in mine))
            log_metric(f"env/{env_id}/success", statistics.fmean(env_success[i] for i in mine))
    return list(env_reward)


# ---- the run -----------------------------------------------------------------------------------------------------
def tiny_model(out: Path, rows: list[dict[str, Any]]) -> Path:
    """The trainer's tiny random-weight model, its tokenizer trained on these environments' prompts."""
    from agent_trainer.tiny_model import build_tiny_model

    texts = sorted({m["content"] for row in rows for m in row["prompt"]})
    texts += ["Thought: I act.\nAction: inventory", "Action: search[red shirt]", "Action: click[buy now]"]
    return build_tiny_model(out, None, texts=texts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AGENTRL_URL", "http://127.0.0.1:36003"),
                        help="the balancer (each environment's OpenEnv face at <url>/<env>/openenv)")  # fmt: skip
    parser.add_argument("--envs", default="textcraft,babyai,webshop", help="one environment or a mix")
    parser.add_argument("--catalog", default=os.environ.get("CATALOG_DIR"), help="WebShop's prepared catalog")
    parser.add_argument("--model", default=None, help="a local model directory (default: the tiny model)")
    parser.add_argument("--out", default="outputs/trl", help="checkpoint-free run directory: summary.json")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps")
    parser.add_argument("--tasks", type=int, default=8, help="training tasks per environment")
    parser.add_argument("--per-env", type=int, default=1, help="prompts per environment in each step's batch")
    parser.add_argument("--generations", type=int, default=4, help="GRPO group size (episodes per prompt)")
    parser.add_argument("--max-turns", type=int, default=3, help="model turns per episode")
    parser.add_argument("--turn-tokens", type=int, default=24, help="tokens per model turn")
    parser.add_argument("--warm-start", type=int, default=0, metavar="STEPS",
                        help="first teacher-force the experts' episodes of the run's tasks into the tiny model for "
                        "STEPS steps (agent_trainer.rehearsal.warm_start), so rewards differ within a group")  # fmt: skip
    parser.add_argument("--require-update", action="store_true",
                        help="fail unless GRPO changed the weights (a run whose rewards differed within a group)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--show", action="store_true", help="print every reply and the action parsed from it")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.envs = envs.parse_ids(args.envs)
    args.url = args.url.rstrip("/")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(args.seed)
    out = Path(args.out)
    rows, where = build_rows(args)
    model_dir = Path(args.model) if args.model else tiny_model(out / "tiny-model", rows)
    if args.warm_start:
        from agent_trainer.rehearsal.warm_start import warm_start_tasks

        tasks: dict[str, list[int]] = defaultdict(list)
        for row in rows:
            tasks[row["env"]].append(row["task"])
        warm_start_tasks(model_dir, dict(tasks), args.warm_start, seed=args.seed,
                         catalog_dir=Path(args.catalog) if args.catalog else None)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    group = args.generations * args.per_env * len(args.envs)
    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, max_steps=args.steps, learning_rate=args.lr,
        per_device_train_batch_size=group, num_generations=args.generations, shuffle_dataset=False,
        max_completion_length=args.max_turns * (args.turn_tokens + 512), temperature=1.0, beta=0.0,
        logging_steps=1, save_strategy="no", report_to=[], seed=args.seed, dataloader_num_workers=0,
    )  # fmt: skip
    history: list[dict[str, Any]] = []

    class Record(TrainerCallback):
        def on_log(
            self, _args: Any, state: Any, _control: Any, logs: dict[str, Any] | None = None, **_: Any
        ) -> None:
            if logs and any(key.startswith("env/") for key in logs):
                entry = {"step": state.global_step, **{k: v for k, v in logs.items() if k.startswith("env/")},
                         "loss": logs.get("loss"), "reward": logs.get("reward")}  # fmt: skip
                history.append(entry)
                print("step", json.dumps(entry), flush=True)

    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=[env_reward], args=config,
        train_dataset=Dataset.from_list(rows), rollout_func=make_rollout(args, where), callbacks=[Record()],
    )  # fmt: skip
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))
    per_env = {env_id: [e.get(f"env/{env_id}/reward") for e in history] for env_id in args.envs}
    summary = {
        "envs": args.envs, "steps": trainer.state.global_step, "url": args.url, "model": str(model_dir),
        "episodes_per_step": group, "weights_changed": changed, "seconds": round(time.monotonic() - started, 1),
        "reward_per_env_per_step": per_env, "history": history,
        "versions": {name: metadata.version(name) for name in ("trl", "openenv", "transformers", "torch")},
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2))
    # What "it trained" can mean for a random tiny model: every step ran, every environment's episodes were played and
    # scored at every step. Its weights move only where rewards differed within a group (a random model earns 0
    # everywhere, so its advantages are 0: --warm-start gives it rewards to differ by).
    missing = [env_id for env_id, values in per_env.items() if len(values) != args.steps or None in values]
    if trainer.state.global_step != args.steps or missing:
        print(f"train-trl: FAILED (steps {trainer.state.global_step}/{args.steps}; environments without a logged "
              f"reward at some step: {missing})", file=sys.stderr)  # fmt: skip
        return 1
    if args.require_update and not changed:
        print("train-trl: FAILED (--require-update: the weights did not change; every group's rewards were equal)",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
