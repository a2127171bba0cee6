"""A short supervised warm start of the tiny model on the oracle's episodes, so that the rehearsal's rollouts
earn different rewards and GRPO has non-zero advantages to push through the update.

A random tiny model never names a valid action: every trajectory earns 0, every advantage is 0, and the policy
gradient is 0, so an update with the wrong sign would go unnoticed. Teacher forcing on the oracle's replies
(``Action: search[...]``, ``Action: click[...]``), each step one whole episode as the agent loop's token stream
shows it (every reply of the episode supervised at once), makes the model replay the plans of the run's goals;
sampled hot, it gives a mix of valid and invalid actions, wrong and right purchases: rewards that differ within a
GRPO group, and purchases that earn an env reward. (A 2-layer model does not learn to copy a product ID from the
page within a warm start's budget: it has to remember the run's plans.)

Every environment the trainer knows is warm-started the same way (:func:`warm_start_tasks`, the one entry point
for any environment and any mix): each task's expert (the core's own ``expert``, WebShop's oracle) played in
process, rendered through the trainer's spec of the environment (``agent_trainer.envs``: its system prompt,
first turn and step messages, as the agent loop renders them) and the model's chat template
(:func:`expert_examples`), one supervised loop for all (:func:`supervise`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .checks import check_goal_set, make_core

MARKER = "warm-start.json"


@dataclass(frozen=True)
class Gate:
    """What the warm model must do before a rehearsal trusts it: its rollouts (``rollouts`` per task, sampled at
    ``temperature``, ``turn_tokens`` a reply, at most ``max_steps`` env steps) must earn an env reward in every
    environment with a chance of at least ``1 - miss`` over the run.

    Why: the rehearsal's ``env_reward_earned`` check judges the pipe by whether the model's own episodes earn the
    environment's reward. A warm start that came out weaker on another machine's CPU build (the same recipe, other
    floating-point kernels) made that check fail on a correct pipeline. So the warm start measures itself and
    trains on (``extra_steps`` at a time, at most ``rounds`` times) until it passes, or stops the rehearsal with
    what it measured: the check then fails only where the pipe loses what the model can do.

    The measure: ``samples`` episodes per task, sampled as the run samples them and played in process by the agent
    loop's own episode code (``agent_trainer.episode``: the spec's parser, step, outcome and next user turn); per
    environment, a one-sided 95 % lower bound ``p`` of an episode's chance to earn a reward (Wilson's, over all its
    sampled episodes), and ``(1 - p) ** (tasks x rollouts)`` the chance that the run's episodes earn nothing."""

    temperature: float
    rollouts: int
    turn_tokens: int
    max_steps: int
    samples: int = 4
    miss: float = 1e-6
    extra_steps: int = 500
    rounds: int = 4


def wilson_lower(successes: int, trials: int, z: float = 1.645) -> float:
    """A one-sided 95 % lower confidence bound of a success probability (Wilson's score interval)."""
    if trials <= 0:
        return 0.0
    phat = successes / trials
    centre = phat + z * z / (2 * trials)
    spread = z * math.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials * trials))
    return max(0.0, (centre - spread) / (1 + z * z / trials))


def answer(transition: Any) -> dict[str, Any]:
    """A core's ``Transition`` as the environment's client answers it, which the trainer's spec reads
    (``first_message``, ``step_message``, ``outcome``): observation, reward, done, state, info."""
    return {"observation": transition.observation, "reward": float(transition.reward), "done": bool(transition.done),
            "state": transition.state, "info": dict(transition.info)}  # fmt: skip


class InProcessClient:
    """The native client's ``reset``/``step`` over a core in this process (:func:`.checks.make_core`), for
    :func:`sampled_episode` (the agent loop's episode code needs a client; the answers are the client's,
    :func:`answer`)."""

    def __init__(self, env_id: str, core: Any) -> None:
        self.env_id, self.core = env_id, core

    async def reset(self, task: int, goal_set: str | None = None, split: str | None = None) -> dict[str, Any]:
        check_goal_set(self.core, goal_set)  # WebShop's reset fields: the core plays one goal set
        return answer(self.core.reset(task))

    async def step(self, state: Any, action: str) -> dict[str, Any]:
        return answer(self.core.step(state, action))

    async def close(self, state: Any) -> bool:
        closer = getattr(self.core, "close", None)
        return bool(closer(state)) if closer else False


def sampled_episode(env_id: str, task: int, reply_for: Any, *, core: Any, max_steps: int,
                    max_observation_chars: int = 0) -> float:  # fmt: skip
    """One episode of ``task`` whose replies come from ``reply_for(messages)``, played as the agent loop plays it
    (``agent_trainer.episode``); the env reward it earned."""
    import asyncio

    from .. import envs
    from ..config import InteractionSettings
    from ..episode import Episode, next_message, play_turn
    from ..episode import reset as reset_episode

    spec = envs.get(env_id)
    client = InProcessClient(env_id, core)
    settings = InteractionSettings(max_observation_chars=max_observation_chars)

    async def play() -> float:
        first = await reset_episode(spec, client, task)
        episode = Episode(state=first["state"], goal=task, goal_set=None, split="train")
        messages = [{"role": "system", "content": spec.system_prompt},
                    {"role": "user", "content": spec.first_message(first)}]  # fmt: skip
        try:
            for _ in range(max_steps):
                reply = reply_for(messages)
                turn = await play_turn(spec, settings, client, episode, reply)
                if turn.done:
                    break
                messages += [{"role": "assistant", "content": reply},
                             {"role": "user", "content": next_message(spec, turn, settings)}]  # fmt: skip
            return episode.reward
        finally:
            if spec.holds_simulator:
                await client.close(episode.state)

    return asyncio.run(play())


def gate_report(model_dir: Path, tasks: Mapping[str, Sequence[int]], gate: Gate, *, catalog_dir: Path | None = None,
                max_observation_chars: int = 0, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """The :class:`Gate`'s verdict on the model at ``model_dir`` for ``tasks`` (env id -> task indices): per
    environment the sampled episodes, how many earned a reward, the lower bound of that chance and the chance that
    the run's rollouts earn nothing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .generation import generate_tokens

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    eos = {
        tokenizer.eos_token_id,
        *([tokenizer.convert_tokens_to_ids("<|im_end|>")] if "<|im_end|>" in tokenizer.get_vocab() else []),
    }

    def reply_for(messages: list[dict[str, str]]) -> str:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
        produced, _, _ = generate_tokens(model, ids, gate.turn_tokens, temperature=gate.temperature, top_k=-1,
                                         top_p=1.0, generator=generator, eos_ids=eos)  # fmt: skip
        return tokenizer.decode(produced, skip_special_tokens=True)

    per_env = {}
    for env_id, ids in tasks.items():
        core = make_core(env_id, catalog_dir)
        earned = sum(
            sampled_episode(env_id, int(task), reply_for, core=core, max_steps=gate.max_steps,
                            max_observation_chars=max_observation_chars) > 0
            for task in ids for _ in range(gate.samples)
        )  # fmt: skip
        trials = len(ids) * gate.samples
        low = wilson_lower(earned, trials)
        per_env[env_id] = {"episodes": trials, "earned": earned, "p_lower": round(low, 4),
                           "p_no_reward": (1.0 - low) ** (len(ids) * gate.rollouts)}  # fmt: skip
    return {"ok": all(e["p_no_reward"] <= gate.miss for e in per_env.values()), "per_env": per_env,
            "gate": asdict(gate)}  # fmt: skip


class WarmStartTooWeak(RuntimeError):
    """The warm start could not make a model whose rollouts earn a reward often enough (the gate's figures say)."""


def expert_plan(env_id: str, task: int, *, core: Any) -> list[str]:
    """The expert's actions for ``task`` of ``env_id`` on its in-process ``core`` (the core's ``expert``: WebShop's
    is the catalog's oracle)."""
    return list(core.expert(task) or [])


def expert_episode(env_id: str, task: int, plan: Sequence[str], *, core: Any, max_observation_chars: int = 0
                   ) -> tuple[list[tuple[list[dict[str, str]], str]], dict[str, Any]]:  # fmt: skip
    """``plan`` played on ``task`` in process, as the agent loop plays and renders it through the environment's
    spec: ``([(conversation so far, reply)] per step, {"success", "env_reward", "steps"})``. The replies are
    ``Action: <action>``, parsed by the spec as the agent loop parses them (an action the spec would send
    differently ends the episode there: the expert's episode is what the model will see)."""
    from .. import envs

    spec = envs.get(env_id)
    first = answer(core.reset(task))
    messages = [{"role": "system", "content": spec.system_prompt},
                {"role": "user", "content": spec.first_message(first)}]  # fmt: skip
    state, examples, outcome = first["state"], [], None
    for action in plan:
        reply = f"Action: {action}"
        parsed = spec.parse(reply)
        if parsed.action != action:
            break
        examples.append((list(messages), reply))
        result = answer(core.step(state, parsed.action))
        state = result["state"]
        outcome = spec.outcome(result, parsed)
        if outcome.done:
            break
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": spec.step_message(result, parsed, outcome, max_observation_chars)}]  # fmt: skip
    return examples, {"success": bool(outcome and outcome.done and outcome.success),
                      "env_reward": float(outcome.env_reward) if outcome else 0.0, "steps": len(examples)}  # fmt: skip


def expert_examples(tasks: Mapping[str, Sequence[int]], *, catalog_dir: Path | None = None,
                    max_observation_chars: int = 0) -> list[tuple[list[dict[str, str]], str]]:  # fmt: skip
    """(conversation so far, the expert's next reply) for every step of every task of every environment
    (``tasks``: env id -> task indices), as :func:`expert_episode` renders them."""
    examples = []
    for env_id, ids in tasks.items():
        core = make_core(env_id, catalog_dir)
        for task in ids:
            plan = expert_plan(env_id, int(task), core=core)
            examples += expert_episode(
                env_id, int(task), plan, core=core, max_observation_chars=max_observation_chars
            )[0]
    return examples


def solvable_tasks(env_id: str, candidates: Sequence[int], count: int, max_steps: int, *,
                   catalog_dir: Path | None = None, max_observation_chars: int = 0, scan: int = 400
                   ) -> list[int]:  # fmt: skip
    """Up to ``count`` of ``candidates`` (in order, at most ``scan`` looked at) whose expert episode, played as
    the agent loop plays it, succeeds in at most ``max_steps`` env steps and whose first user turn is unique among
    those picked (the warm-started model tells its tasks apart by it)."""
    core = make_core(env_id, catalog_dir)
    picked: list[int] = []
    openings: set[str] = set()
    for task in list(candidates)[:scan]:
        if len(picked) >= count:
            break
        plan = expert_plan(env_id, int(task), core=core)
        if not plan or len(plan) > max_steps:
            continue
        examples, result = expert_episode(
            env_id, int(task), plan, core=core, max_observation_chars=max_observation_chars
        )
        opening = examples[0][0][1]["content"] if examples else ""
        if result["success"] and opening not in openings:
            picked.append(int(task))
            openings.add(opening)
    return picked


def episode_streams(tokenizer: Any, examples: Sequence[tuple[list[dict[str, str]], str]]
                    ) -> list[tuple[list[int], list[int]]]:  # fmt: skip
    """One ``(ids, labels)`` per episode of ``examples`` (as :func:`expert_examples` lists them): the token stream
    the agent loop builds (the chat template's render of each new context appended, the reply's tokens and the
    end-of-turn token after each), the labels -100 except on the replies."""

    def render(messages: list[dict[str, str]]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    streams: list[tuple[list[int], list[int]]] = []
    ids: list[int] = []
    labels: list[int] = []
    for messages, reply in examples:
        context = render(messages)
        if context[: len(ids)] != ids or len(messages) <= 2:  # a new episode (its first turn)
            if ids:
                streams.append((ids, labels))
            ids, labels = [], []
        new = context[len(ids) :]
        target = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
        ids = ids + new + target
        labels = labels + [-100] * len(new) + target
    if ids:
        streams.append((ids, labels))
    return streams


def tasks_recipe(tasks: Mapping[str, Sequence[int]], steps: int, lr: float, seed: int, max_observation_chars: int,
                 gate: Gate | None = None) -> dict[str, Any]:  # fmt: skip
    """What a :func:`warm_start_tasks` run is keyed by (the marker file holds it; another recipe retrains)."""
    return {"tasks": {env: [int(t) for t in ids] for env, ids in tasks.items()}, "steps": steps, "lr": lr,
            "seed": seed, "unit": "episode", "max_observation_chars": max_observation_chars,
            **({"gate": asdict(gate)} if gate else {})}  # fmt: skip


def warm_start_tasks(model_dir: Path, tasks: Mapping[str, Sequence[int]], steps: int = 1500, *, lr: float = 3e-3,
                     seed: int = 0, max_observation_chars: int = 0, catalog_dir: Path | None = None,
                     gate: Gate | None = None) -> dict[str, Any]:  # fmt: skip
    """Teacher-force the experts' episodes of ``tasks`` (env id -> task indices, any environment the trainer
    knows, several at once) into the model at ``model_dir`` for ``steps`` episode steps (in place; once per
    recipe, :func:`tasks_recipe`). WebShop's needs ``catalog_dir``. Returns the marker's report."""
    from .. import envs

    for env_id in tasks:
        envs.get(env_id)
    if not any(tasks.values()):
        raise ValueError("warm start: no task given")
    recipe = tasks_recipe(tasks, steps, lr, seed, max_observation_chars, gate)
    measure = None
    if gate is not None:

        def measure(model: Path) -> dict[str, Any]:
            return gate_report(
                model,
                tasks,
                gate,
                catalog_dir=catalog_dir,
                max_observation_chars=max_observation_chars,
                seed=seed,
            )

    return supervise(model_dir, lambda: expert_examples(tasks, catalog_dir=catalog_dir,
                                                        max_observation_chars=max_observation_chars),
                     recipe, steps=steps, lr=lr, seed=seed, gate=gate, measure=measure)  # fmt: skip


def recipe_stale(model_dir: Path, recipe: Mapping[str, Any]) -> bool:
    """Whether ``model_dir`` was warm-started with another recipe, or trained without passing its gate (rebuild it
    first: training is in place)."""
    marker = Path(model_dir) / MARKER
    if not marker.exists():
        return (Path(model_dir) / "config.json").exists() and "gate" in recipe
    return json.loads(marker.read_text()).get("recipe") != dict(recipe)


def supervise(model_dir: Path, examples: Any, recipe: Mapping[str, Any], *, steps: int, lr: float = 3e-3,
              seed: int = 0, gate: Gate | None = None, measure: Any = None) -> dict[str, Any]:  # fmt: skip
    """The supervised loop every warm start runs: ``steps`` AdamW steps, each one whole episode of ``examples``
    (a callable giving ``[(conversation, reply)]``, called only when the model must be trained) drawn at random,
    the replies' tokens as labels; the model saved in place with a marker holding ``recipe`` (the same recipe
    again returns the marker's report without training). With a ``gate``, the model is then measured
    (``measure(model_dir)``: :func:`gate_report` on the run's tasks) and trained on ``gate.extra_steps`` at a time
    until it passes; raises
    :class:`WarmStartTooWeak` after ``gate.rounds`` more. One intra-op thread, as every process of the run: two
    threads on a busy 2-core machine run 5-20x slower."""
    import torch

    if steps < 1:
        raise ValueError("warm start: steps must be at least 1")
    marker = Path(model_dir) / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("recipe") == dict(recipe):
        return json.loads(marker.read_text())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        given = examples() if callable(examples) else list(examples)
        report = _train(model_dir, given, dict(recipe), steps, lr, seed, write_marker=gate is None)
        if gate is None:
            return report
        verdict = measure(model_dir)  # no marker until it passes: a rerun trains it afresh
        extra = 0
        while not verdict["ok"] and extra < gate.rounds:
            extra += 1
            print(f"warm start: not yet good enough ({_gate_line(verdict)}): {gate.extra_steps} more steps",
                  flush=True)  # fmt: skip
            _train(model_dir, given, dict(recipe), gate.extra_steps, lr, seed + extra, write_marker=False)
            verdict = measure(model_dir)
        if not verdict["ok"]:
            raise WarmStartTooWeak(
                f"the warm-started model's rollouts would earn no env reward in {_gate_line(verdict)} after "
                f"{steps + extra * gate.extra_steps} supervised steps: the rehearsal's env_reward_earned check "
                "could fail on a correct pipeline, so it stops here (raise the warm start's steps)"
            )
        report = {**report, "gate": verdict, "extra_steps": extra * gate.extra_steps}
        marker.write_text(json.dumps(report))
        return report
    finally:
        torch.set_num_threads(threads)


def _gate_line(verdict: Mapping[str, Any]) -> str:
    return "; ".join(f"{env}: {e['earned']} of {e['episodes']} sampled episodes earned a reward, P(no reward in "
                     f"the run) {e['p_no_reward']:.1e}" for env, e in verdict["per_env"].items())  # fmt: skip


def _train(model_dir: Path, examples: Sequence[tuple[list[dict[str, str]], str]], recipe: dict[str, Any],
           steps: int, lr: float, seed: int, write_marker: bool = True) -> dict[str, Any]:  # fmt: skip
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = Path(model_dir) / MARKER
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    batches = [
        (torch.tensor([ids]), torch.tensor([labels])) for ids, labels in episode_streams(tokenizer, examples)
    ]
    if not batches:
        raise ValueError("warm start: the experts gave no episode")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    order = random.Random(seed)
    losses = []
    for _ in range(steps):
        ids, labels = batches[order.randrange(len(batches))]
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.save_pretrained(model_dir)
    report = {"recipe": recipe, "episodes": len(batches), "first_loss": round(losses[0], 3),
              "last_loss": round(sum(losses[-20:]) / min(20, len(losses)), 3)}  # fmt: skip
    if write_marker:
        marker.write_text(json.dumps(report))
    return report
