"""The rehearsal's checks of one training step, as pure functions of its trajectories (no verl, no Ray here).

Each check compares what the trainer used with a source the training pipe cannot bend:

- **the loss mask** (``response_mask``, what the actor's loss averages over) with the model's own tokens as the
  rollout server produced them (its record of every generation: prompt digest and tokens): a token the model did
  not produce (an env page, a separator) must never be trained on, and every model token must be;
- **the reward** the trainer used (``token_level_scores`` / ``rm_scores``) with the environment's reward for the
  actions the model took, replayed in-process on the environment's own core (:func:`make_core`, WebShop's on the
  run's catalog) through its spec, as the agent loop plays them (``agent_trainer.envs.replay.replay_score``: each
  environment is deterministic and stateless), minus the declared invalid-reply penalty: a sign flip or a shaping
  bug anywhere between the env and the advantage shows;
- **the update's direction**, judged against GRPO advantages computed here from that replayed reward (not the
  advantages the pipe computed), on the loss tokens only: the first-order change of verl's token-mean surrogate,
  ``sum_i A_i * sum_t dlogp_it / T``, must be positive, and responses with a positive advantage must have become
  more likely than those with a negative one, in every step that has non-zero advantages;
- **the weight sync** (see :func:`sync_record`): every actor tensor name the rollout holds, none missing, none
  unknown, a load per sync, and the log-probs of a fixed sequence under the rollout equal to the actor's.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: |pipe reward - replayed reward| above this is a mismatch.
REWARD_TOLERANCE = 1e-5
#: max |rollout log-prob - actor log-prob| on the fixed sequence after a sync (both fp32; a stale sync after one
#: step at the rehearsal's lr moves some token by ~1e-2).
SYNC_TOLERANCE = 1e-3


def prompt_digest(ids: Sequence[int]) -> str:
    """A short digest of a token sequence (the rollout server keys its generations by their prompt)."""
    return hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Generation:
    """One generation as the rollout server produced it: its prompt (length, digest) and the new tokens."""

    prompt_len: int
    digest: str
    tokens: tuple[int, ...]


class GenerationIndex:
    """The rollout server's generations, to find the model's own turns inside a trajectory's token stream."""

    def __init__(self, generations: Iterable[Generation]) -> None:
        self._by_len: dict[int, dict[str, list[tuple[int, ...]]]] = defaultdict(lambda: defaultdict(list))
        self.count = 0
        for generation in generations:
            self._by_len[generation.prompt_len][generation.digest].append(tuple(generation.tokens))
            self.count += 1

    def spans(self, ids: Sequence[int], start: int) -> list[tuple[int, int]]:
        """``(begin, end)`` of every model turn in ``ids`` at or after ``start``: a generation whose prompt is
        ``ids[:begin]`` and whose tokens are ``ids[begin:end]`` (cut at the end of ``ids``)."""
        array = np.asarray(ids, dtype=np.int64)
        found = []
        for prompt_len, by_digest in self._by_len.items():
            if prompt_len < start or prompt_len >= len(array):
                continue
            candidates = by_digest.get(prompt_digest(array[:prompt_len]))
            for tokens in candidates or ():
                end = min(len(array), prompt_len + len(tokens))
                if tuple(int(t) for t in array[prompt_len:end]) == tokens[: end - prompt_len]:
                    found.append((prompt_len, end))
                    break
        return sorted(found)


@dataclass
class Trajectory:
    """One trajectory of a training step, as the trainer holds it (unpadded).

    ``ids``: prompt then response tokens; ``mask``: the loss mask over the response; ``score``: the reward the
    trainer used; ``before``/``after``: the actor's log-probs of the response tokens before and after the update.
    """

    ids: list[int]
    prompt_len: int
    mask: list[int]
    score: float
    uid: str
    goal: int | None = None
    goal_set: str | None = None
    agent_name: str | None = None
    env_id: str | None = None  # the row's environment (None: its row names none, and the replay refuses it)
    advantage: float = 0.0  # the pipe's own (for the report)
    before: np.ndarray | None = None
    after: np.ndarray | None = None
    spans: list[tuple[int, int]] = field(default_factory=list)


def expected_mask(trajectory: Trajectory) -> list[int]:
    """1 on the response tokens the model produced (its spans), 0 elsewhere."""
    mask = [0] * (len(trajectory.ids) - trajectory.prompt_len)
    for begin, end in trajectory.spans:
        for position in range(begin - trajectory.prompt_len, end - trajectory.prompt_len):
            mask[position] = 1
    return mask


def mask_record(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Loss mask against the model's own tokens: env tokens trained on, model tokens left out, trajectories with
    no model turn found (unverifiable: the rollout server has no record of their generations)."""
    env_trained = model_untrained = unverifiable = bad = 0
    loss_tokens = model_tokens = 0
    for trajectory in trajectories:
        expected = expected_mask(trajectory)
        actual = list(trajectory.mask[: len(expected)]) + [0] * max(0, len(expected) - len(trajectory.mask))
        if not trajectory.spans:
            unverifiable += 1
        wrong_in = sum(1 for a, e in zip(actual, expected, strict=True) if a and not e)
        wrong_out = sum(1 for a, e in zip(actual, expected, strict=True) if e and not a)
        env_trained += wrong_in
        model_untrained += wrong_out
        bad += 1 if wrong_in or wrong_out else 0
        loss_tokens += sum(1 for a in actual if a)
        model_tokens += sum(expected)
    return {"trajectories": len(trajectories), "loss_tokens": loss_tokens, "model_tokens": model_tokens,
            "env_tokens_in_loss": env_trained, "model_tokens_outside_loss": model_untrained,
            "mismatched_trajectories": bad, "unverifiable": unverifiable,
            "ok": bool(trajectories) and not bad and not unverifiable}  # fmt: skip


def played_replies(trajectory: Trajectory, decode: Callable[[list[int]], str]) -> list[str]:
    """The model's replies the env was sent, in order.

    The agent loops play every reply; verl's ``ToolAgentLoop`` (``tool_agent``) ends without playing the
    last one when it hit the turn or length limit, which is exactly when nothing follows it in the stream (a played
    reply is always followed by the env's answer, the end-of-episode message included).
    """
    replies = [decode(trajectory.ids[begin:end]) for begin, end in trajectory.spans]
    if (
        trajectory.agent_name == "tool_agent"
        and trajectory.spans
        and trajectory.spans[-1][1] >= len(trajectory.ids)
    ):
        replies = replies[:-1]
    return replies


def make_core(env_id: str, catalog_dir: Path | None = None) -> Any:
    """The in-process core of ``env_id`` as a replica of the service makes it (``agent_envs.envs.registry.make``:
    the environment contract, WebShop's ``WebShopTextEnv`` included, with the replicas' settings), so that a
    replay or an expert episode plays what the served environment plays. ``catalog_dir``: WebShop's catalog
    (None: the one the service's settings name, ``WEBSHOP_CATALOG``); an environment that reads no such data
    ignores it."""
    from agent_envs.envs import registry

    if catalog_dir is None:
        return registry.make(env_id)
    from agent_envs.api.settings import Settings

    return registry.make(env_id, Settings(catalog=catalog_dir))


def check_goal_set(core: Any, goal_set: str | None) -> None:
    """Refuse a task of a goal set other than the one ``core`` plays.

    Why this one branch: WebShop's tasks are the goals of goal sets, and its contract env (``WebShopTextEnv``)
    plays those of one, its ``default_goal_set`` (``reset(task)``); a row of another goal set
    (``extra_info.goal_set``) would replay another goal of the same index and judge the trainer's reward against
    the wrong episode. No other environment has goal sets (their rows name none)."""
    if goal_set and goal_set != getattr(core, "default_goal_set", None):
        raise ValueError(f"a task of the goal set {goal_set!r}, but the in-process core plays the goal set "
                         f"{getattr(core, 'default_goal_set', None)!r}")  # fmt: skip


def env_of(trajectory: Trajectory) -> str:
    """The trajectory's environment, as its row names it (``extra_info.env`` or ``data_source``)."""
    if not trajectory.env_id:
        raise ValueError("a trajectory whose row names no environment (extra_info.env or data_source)")
    return trajectory.env_id


def replay_episode(
    trajectory: Trajectory, replies: Sequence[str], penalty: float, core: Any
) -> dict[str, float]:
    """``{"score", "env_reward", "success", "steps"}`` of ``replies`` replayed on the trajectory's task in its
    environment's in-process ``core`` (:func:`make_core`), as the agent loop plays them through the environment's
    spec (``envs.replay.replay_score``): each step's change in the env reward, less ``penalty`` for a reply with
    no usable action."""
    from ..envs.replay import replay_score

    env_id = env_of(trajectory)
    if trajectory.goal is None:
        raise ValueError(f"a {env_id} trajectory without a task (its row's extra_info names none)")
    check_goal_set(core, trajectory.goal_set)
    return replay_score(env_id, int(trajectory.goal), replies, penalty=penalty, core=core)


def env_figures(trajectories: Sequence[Trajectory], replayed: Sequence[Mapping[str, float]]
                ) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per environment: trajectories, the replayed env reward's mean, success rate and steps' mean."""
    out: dict[str, dict[str, Any]] = {}
    for env_id in sorted({env_of(t) for t in trajectories}):
        rows = [r for t, r in zip(trajectories, replayed, strict=True) if env_of(t) == env_id]
        out[env_id] = {"trajectories": len(rows), "env_reward_mean": _mean([r["env_reward"] for r in rows]),
                       "success_rate": _mean([r.get("success", 0.0) for r in rows]),
                       "steps_mean": _mean([r["steps"] for r in rows])}  # fmt: skip
    return out


def reward_record(
    trajectories: Sequence[Trajectory], replayed: Sequence[Mapping[str, float]]
) -> dict[str, Any]:
    """The trainer's reward against the replayed one, per trajectory."""
    diffs = [abs(t.score - r["score"]) for t, r in zip(trajectories, replayed, strict=True)]
    env_rewards = [r["env_reward"] for r in replayed]
    return {"trajectories": len(trajectories), "max_abs_diff": max(diffs, default=0.0),
            "mismatched": sum(1 for d in diffs if d > REWARD_TOLERANCE),
            "pipe_score_mean": _mean([t.score for t in trajectories]),
            "env_score_mean": _mean([r["score"] for r in replayed]), "env_reward_mean": _mean(env_rewards),
            "purchases_with_reward": sum(1 for r in env_rewards if r > 0),
            "ok": bool(trajectories) and all(d <= REWARD_TOLERANCE for d in diffs)}  # fmt: skip


def grpo_advantages(scores: Sequence[float], groups: Sequence[str], eps: float = 1e-6) -> list[float]:
    """GRPO's outcome advantage, written here from its definition: ``(r - mean(group)) / (std(group) + eps)``
    (unbiased std; a group of one has advantage 0), so the check does not reuse the pipe's advantage."""
    members: dict[str, list[float]] = defaultdict(list)
    for score, group in zip(scores, groups, strict=True):
        members[group].append(float(score))
    stats = {}
    for group, values in members.items():
        if len(values) < 2:
            stats[group] = (values[0], 1.0)
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        stats[group] = (mean, std)
    return [(float(s) - stats[g][0]) / (stats[g][1] + eps) for s, g in zip(scores, groups, strict=True)]


def direction_record(
    step: int, trajectories: Sequence[Trajectory], advantages: Sequence[float]
) -> dict[str, Any]:
    """How the update moved the log-probs of the loss tokens, against ``advantages`` (the env's, replayed).

    ``weighted_change``: ``sum_i A_i * sum_t dlogp_it / T`` over the loss tokens, the first-order change of the
    token-mean policy-gradient surrogate the actor ascends (positive when the update follows the advantages);
    ``positive_mean_change`` / ``negative_mean_change``: the mean per-token change of the responses with a positive
    / negative advantage. ``informative``: some advantage is non-zero (else the step cannot show a direction).
    """
    changes, sums, tokens = [], [], 0
    for trajectory in trajectories:
        assert trajectory.before is not None and trajectory.after is not None
        loss = np.asarray(trajectory.mask[: len(trajectory.before)], dtype=bool)
        delta = np.asarray(trajectory.after, dtype=np.float64) - np.asarray(
            trajectory.before, dtype=np.float64
        )
        delta = delta[: len(loss)][loss[: len(delta)]]
        sums.append(float(delta.sum()))
        changes.append(float(delta.mean()) if delta.size else 0.0)
        tokens += int(delta.size)
    positive = [c for c, a in zip(changes, advantages, strict=True) if a > 0]
    negative = [c for c, a in zip(changes, advantages, strict=True) if a < 0]
    weighted = sum(a * s for a, s in zip(advantages, sums, strict=True)) / max(tokens, 1)
    pipe = [t.advantage for t in trajectories]
    agree = sum(1 for p, a in zip(pipe, advantages, strict=True) if p * a > 0)
    disagree = sum(1 for p, a in zip(pipe, advantages, strict=True) if p * a < 0)
    record = {"step": step, "responses": len(changes), "loss_tokens": tokens, "positive": len(positive),
              "negative": len(negative), "positive_mean_change": _mean(positive),
              "negative_mean_change": _mean(negative), "weighted_change": weighted,
              "pipe_advantage_signs_agree": agree, "pipe_advantage_signs_disagree": disagree,
              "informative": any(a != 0 for a in advantages)}  # fmt: skip
    record["right_way"] = right_way(record)
    return record


def right_way(record: Mapping[str, Any]) -> bool:
    """Both signs present, the advantage-weighted change positive, and positive-advantage responses more likely
    than negative ones afterwards (on the loss tokens)."""
    return bool(record["positive"] and record["negative"] and record["weighted_change"] > 0
                and record["positive_mean_change"] > record["negative_mean_change"])  # fmt: skip


def direction_ok(records: Sequence[Mapping[str, Any]]) -> bool:
    """Every step with non-zero advantages went the right way, and there was at least one such step."""
    informative = [r for r in records if r.get("informative")]
    return bool(informative) and all(right_way(r) for r in informative)


def step_record(step: int, trajectories: Sequence[Trajectory], index: GenerationIndex, env: Any,
                decode: Callable[[list[int]], str], penalty: float, default_agent: str | None = None
                ) -> dict[str, Any]:  # fmt: skip
    """One training step judged: the model's turns found in each trajectory (``index``), the loss mask against
    them, the env's reward replayed against the trainer's, and the update against GRPO advantages of that
    replayed reward. ``env``: the in-process core of each trajectory's environment, a callable ``env_id -> core``
    (:func:`replay_episode`), or one core when every trajectory is of its environment.
    ``{"step", "mask", "reward", "direction", "envs"}`` (``envs``: :func:`env_figures`)."""
    core_of = env if callable(env) and not hasattr(env, "reset") else (lambda _env_id: env)
    replayed = []
    for trajectory in trajectories:
        trajectory.spans = index.spans(trajectory.ids, trajectory.prompt_len)
        trajectory.agent_name = trajectory.agent_name or default_agent
        replies = played_replies(trajectory, decode)
        replayed.append(replay_episode(trajectory, replies, penalty, core_of(env_of(trajectory))))
    advantages = grpo_advantages([r["score"] for r in replayed], [t.uid for t in trajectories])
    return {"step": step, "mask": mask_record(trajectories), "reward": reward_record(trajectories, replayed),
            "direction": direction_record(step, trajectories, advantages),
            "envs": env_figures(trajectories, replayed)}  # fmt: skip


def tied_names(state: Mapping[str, Any]) -> dict[str, set[str]]:
    """For each name of a model's ``state_dict()``, the other names that share its storage (tied weights)."""
    by_pointer: dict[int, set[str]] = defaultdict(set)
    for name, tensor in state.items():
        by_pointer[tensor.data_ptr()].add(name)
    return {name: by_pointer[tensor.data_ptr()] - {name} for name, tensor in state.items()}


def name_check(own: Mapping[str, Any], pushed: Iterable[str]) -> dict[str, list[str]]:
    """The pushed tensor names against the rollout model's own: ``missing`` (not pushed, and not tied to a pushed
    one) and ``unknown`` (pushed, but the rollout model has no such tensor: a name-mapping bug)."""
    pushed = set(pushed)
    tied = tied_names(own)
    missing = sorted(n for n in own if n not in pushed and not (tied.get(n, set()) & pushed))
    return {"missing": missing, "unknown": sorted(pushed - set(own))}


def sync_record(sync: int, global_steps: int | None, replicas: Sequence[Mapping[str, Any]],
                previous_versions: Mapping[int, int], tolerance: float = SYNC_TOLERANCE) -> dict[str, Any]:  # fmt: skip
    """One weight sync, judged: per replica ``{"replica", "version", "missing", "unknown", "max_abs_diff"}``; ok when
    every replica loaded a new version (its version went up), with no name missing or unknown, and its log-probs of
    the fixed sequence are within ``tolerance`` of the actor's."""
    judged = []
    for replica in replicas:
        loaded = replica["version"] > previous_versions.get(replica["replica"], 0)
        ok = (loaded and not replica["missing"] and not replica["unknown"]
              and replica["max_abs_diff"] is not None and replica["max_abs_diff"] <= tolerance)  # fmt: skip
        judged.append({**replica, "loaded": loaded, "ok": ok})
    return {"sync": sync, "global_steps": global_steps, "tolerance": tolerance, "replicas": judged,
            "ok": bool(judged) and all(r["ok"] for r in judged)}  # fmt: skip


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
