"""The rehearsal's checks inside verl's trainer (installed in the trainer's process by the rehearsal's setup hook
when ``$AGENTRL_REHEARSAL_CHECKS`` names a directory; :mod:`.checks` holds the judgements).

- Around the trainer's own actor update (verl 0.7.1's ``RayPPOTrainer._update_actor``, verl 0.9.1's v1
  ``PPOTrainer._update_actor``, the step's data in TransferQueue) every training step: the step's trajectories
  (token stream, loss mask, the reward the trainer used, the actor's log-probs before the update, ``old_log_probs``,
  and after it, the actor worker group's ``compute_log_prob`` on the same batch); the model's own tokens from the
  rollout servers' records; the env's reward replayed in-process (each trajectory in its own environment: the
  row's ``extra_info.env`` or ``data_source``). One JSON line per step in ``steps.jsonl``:
  ``{"step", "mask", "reward", "direction", "envs"}``.
- After every weight sync (``checkpoint_manager.update_weights``: at start, after a resume, after each step, around
  validation): each rollout server's load report and its log-probs of a fixed sequence (``fixed_sequence.json``,
  written by the rehearsal) against the actor's, computed by the actor worker group. One JSON line per sync in
  ``sync.jsonl``.

Settings (the rehearsal sets them for every process): ``AGENTRL_REHEARSAL_CATALOG`` (the env's catalog, for the
replay), ``AGENTRL_INVALID_ACTION_PENALTY`` (the declared penalty), ``AGENTRL_REHEARSAL_TRAIN_AGENT`` (the training
rows' agent loop, when the batch does not say), ``AGENTRL_REHEARSAL_FAIL_FAST=1`` (a failed check ends the run
at once, :class:`CheckFailed`, after its record is written; the rehearsal's summary then says which).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import checks

ENV = "AGENTRL_REHEARSAL_CHECKS"
CATALOG_ENV = "AGENTRL_REHEARSAL_CATALOG"
TRAIN_AGENT_ENV = "AGENTRL_REHEARSAL_TRAIN_AGENT"
FAIL_FAST_ENV = "AGENTRL_REHEARSAL_FAIL_FAST"
STEPS_FILE = "steps.jsonl"
SYNC_FILE = "sync.jsonl"
SEQUENCE_FILE = "fixed_sequence.json"


class CheckFailed(RuntimeError):
    """A rehearsal check failed with ``$AGENTRL_REHEARSAL_FAIL_FAST`` set."""


def _fail_fast(what: str, failed: list[str]) -> None:
    if failed and os.environ.get(FAIL_FAST_ENV, "").strip() not in ("", "0"):
        raise CheckFailed(f"rehearsal check(s) failed at {what}: {', '.join(failed)} (see {_directory()})")


def _directory() -> Path:
    return Path(os.environ[ENV])


def _write(name: str, record: dict[str, Any]) -> None:
    with open(_directory() / name, "a") as out:
        out.write(json.dumps(record, default=float) + "\n")
    print(f"[rehearsal] {name}: {json.dumps(record, default=float)[:2000]}", flush=True)


class StepChecker:
    """What the checks keep between steps in the trainer's process: the rollout servers' generations (fetched
    incrementally), the replay env, the servers' last load versions."""

    def __init__(self) -> None:
        self.generations: list[checks.Generation] = []
        self.cursors: dict[int, int] = {}
        self.versions: dict[int, int] = {}
        self.syncs = 0
        self._cores: dict[str, Any] = {}

    @staticmethod
    def servers(trainer: Any) -> list[Any]:
        """The rollout servers (one ``CpuLLMServer`` actor per replica)."""
        return [replica._server_handle for replica in trainer.checkpoint_manager.replicas]

    def index(self, trainer: Any) -> checks.GenerationIndex:
        import ray

        for rank, server in enumerate(self.servers(trainer)):
            new, cursor = ray.get(server.generations.remote(self.cursors.get(rank, 0)))
            self.generations.extend(new)
            self.cursors[rank] = cursor
        return checks.GenerationIndex(self.generations)

    def env(self, env_id: str) -> Any:
        """The in-process core of ``env_id`` for the replay (:func:`.checks.make_core`; WebShop's on the run's
        catalog), made once."""
        if env_id not in self._cores:
            catalog = os.environ.get(CATALOG_ENV)
            self._cores[env_id] = checks.make_core(env_id, Path(catalog) if catalog else None)
        return self._cores[env_id]

    def check_step(self, trainer: Any, step: int, trajectories: list[checks.Trajectory]) -> dict[str, Any]:
        """The three step checks on ``trajectories`` (their ``before``/``after`` log-probs filled in)."""

        def decode(ids: list[int]) -> str:
            return trainer.tokenizer.decode(ids, skip_special_tokens=True)

        record = checks.step_record(step, trajectories, self.index(trainer), self.env, decode,
                                    penalty=float(os.environ.get("AGENTRL_INVALID_ACTION_PENALTY") or 0.0),
                                    default_agent=os.environ.get(TRAIN_AGENT_ENV))  # fmt: skip
        _write(STEPS_FILE, record)
        failed = [name for name in ("mask", "reward") if not record[name]["ok"]]
        if record["direction"]["informative"] and not record["direction"]["right_way"]:
            failed.append("direction")
        _fail_fast(f"step {step}", failed)
        return record

    def check_sync(self, trainer: Any, global_steps: int | None, line: str) -> dict[str, Any]:
        """Each rollout server's last load and its log-probs of the fixed sequence against the actor's."""
        import ray

        sequence = json.loads((_directory() / SEQUENCE_FILE).read_text())
        prompt, response = list(sequence["prompt_ids"]), list(sequence["response_ids"])
        temperature = float(trainer.config.actor_rollout_ref.rollout.temperature)
        actor = actor_log_probs(trainer, prompt, response, line)
        replicas = []
        for rank, server in enumerate(self.servers(trainer)):
            report = ray.get(server.sync_report.remote())
            rollout = np.asarray(
                ray.get(server.score.remote(prompt, response, temperature)), dtype=np.float64
            )
            diff = float(np.abs(rollout - actor).max()) if rollout.shape == actor.shape else None
            replicas.append({"replica": rank, "version": int(report["version"]), "tensors": report["tensors"],
                             "missing": report["missing"], "unknown": report["unknown"], "max_abs_diff": diff})  # fmt: skip
        self.syncs += 1
        record = checks.sync_record(self.syncs, global_steps, replicas, self.versions)
        self.versions.update({r["replica"]: r["version"] for r in replicas})
        _write(SYNC_FILE, record)
        _fail_fast(
            f"weight sync {self.syncs} (global step {global_steps})", [] if record["ok"] else ["weight_sync"]
        )
        return record


_CHECKER: StepChecker | None = None


def checker() -> StepChecker:
    global _CHECKER
    if _CHECKER is None:
        _CHECKER = StepChecker()
    return _CHECKER


def actor_log_probs(trainer: Any, prompt: list[int], response: list[int], line: str) -> np.ndarray:
    """The actor's log-probs of ``response`` after ``prompt`` (two copies: one per data-parallel rank), computed
    by the actor worker group as the trainer computes ``old_log_probs``."""
    ids = torch.tensor([prompt + response] * 2)
    length = ids.shape[1]
    if line == "0.7":
        from verl.protocol import DataProto

        data = DataProto.from_dict(
            tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids),
                     "position_ids": torch.arange(length).expand(2, length).clone(), "prompts": ids[:, : len(prompt)],
                     "responses": ids[:, len(prompt) :], "response_mask": torch.ones(2, len(response), dtype=torch.int64)},
            meta_info={"temperature": trainer.config.actor_rollout_ref.rollout.temperature},
        )  # fmt: skip
        output, _ = trainer._compute_old_log_prob(data)
        return output.batch["old_log_probs"][0].double().numpy()
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested

    def nested(rows: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.nested.as_nested_tensor(list(rows), layout=torch.jagged)

    response_mask = nested([torch.ones(len(response), dtype=torch.int64)] * 2)
    data = TensorDict({"input_ids": nested(list(ids)), "position_ids": nested([torch.arange(length)] * 2),
                       "prompts": nested([ids[0, : len(prompt)]] * 2), "responses": nested([ids[0, len(prompt) :]] * 2),
                       "response_mask": response_mask, "loss_mask": response_mask}, batch_size=2)  # fmt: skip
    tu.assign_non_tensor(data, calculate_entropy=False, compute_loss=False,
                         temperature=float(trainer.config.actor_rollout_ref.rollout.temperature))  # fmt: skip
    output = trainer.actor_rollout_wg.compute_log_prob(data)
    log_probs = response_from_nested(tu.get(output, "log_probs"), response_mask)
    return log_probs.unbind()[0].double().numpy()


# ---- verl 0.7.1 ----------------------------------------------------------------------------------------------
def trajectories_verl07(batch: Any) -> list[checks.Trajectory]:
    """The step's trajectories from 0.7.1's padded ``DataProto`` (prompts left-padded, responses right-padded)."""
    tensors, extra = batch.batch, batch.non_tensor_batch
    prompts, responses, attention = tensors["prompts"], tensors["responses"], tensors["attention_mask"]
    width = prompts.shape[1]
    mask, advantages = tensors["response_mask"], tensors["advantages"]
    scores = tensors["token_level_scores"].sum(-1)
    agents = extra.get("agent_name")
    sources = extra.get("data_source")
    trajectories = []
    for i in range(len(prompts)):
        prompt = prompts[i][attention[i, :width].bool()].tolist()
        length = int(attention[i, width:].sum())
        row_mask = mask[i, :length].long()
        info = _goal(extra["extra_info"][i], sources[i] if sources is not None else None)
        trajectories.append(checks.Trajectory(
            ids=prompt + responses[i, :length].tolist(), prompt_len=len(prompt), mask=row_mask.tolist(),
            score=float(scores[i]), uid=str(extra["uid"][i]), goal=info[0], goal_set=info[1], env_id=info[2],
            agent_name=str(agents[i]) if agents is not None else None,
            advantage=float(advantages[i, :length][row_mask.bool()].mean()) if row_mask.any() else 0.0,
            before=tensors["old_log_probs"][i, :length].double().numpy(),
        ))  # fmt: skip
    return trajectories


def install_verl07() -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    if getattr(RayPPOTrainer._update_actor, "agentrl_rehearsal", False):
        return
    update_actor, init_workers = RayPPOTrainer._update_actor, RayPPOTrainer.init_workers

    def _update_actor(self: Any, batch: Any) -> Any:
        trajectories = trajectories_verl07(batch)
        output = update_actor(self, batch)
        after, _ = self._compute_old_log_prob(batch)
        for i, trajectory in enumerate(trajectories):
            trajectory.after = after.batch["old_log_probs"][i, : len(trajectory.before)].double().numpy()
        checker().check_step(self, int(self.global_steps), trajectories)
        return output

    def _init_workers(self: Any) -> Any:
        output = init_workers(self)
        _watch_syncs(self, "0.7")
        return output

    _update_actor.agentrl_rehearsal = True  # type: ignore[attr-defined]
    RayPPOTrainer._update_actor = _update_actor
    RayPPOTrainer.init_workers = _init_workers


# ---- verl 0.9.1 ----------------------------------------------------------------------------------------------
def _rows(value: Any) -> list[Any]:
    """A TransferQueue field as a list of rows (nested tensors unbound, non-tensor stacks as lists)."""
    if isinstance(value, torch.Tensor):
        return list(value.unbind()) if value.is_nested or value.dim() > 0 else [value]
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


def trajectories_verl09(data: Any) -> list[checks.Trajectory]:
    """The step's trajectories from 0.9.1's TransferQueue fields (nested per row, response-length)."""
    prompts, responses = _rows(data["prompts"]), _rows(data["responses"])
    masks, scores = _rows(data["response_mask"]), _rows(data["rm_scores"])
    advantages, before = _rows(data["advantages"]), _rows(data["old_log_probs"])
    uids, extras = _rows(data["uid"]), _rows(data["extra_info"])
    agents = _rows(data["agent_name"]) if "agent_name" in data.keys() else []  # noqa: SIM118
    agents = agents if len(agents) == len(prompts) else [None] * len(prompts)
    sources = _rows(data["data_source"]) if "data_source" in data.keys() else []  # noqa: SIM118
    sources = sources if len(sources) == len(prompts) else [None] * len(prompts)
    trajectories = []
    for i in range(len(prompts)):
        mask = masks[i].long()
        info = _goal(extras[i], sources[i])
        trajectories.append(checks.Trajectory(
            ids=prompts[i].tolist() + responses[i].tolist(), prompt_len=len(prompts[i]), mask=mask.tolist(),
            score=float(scores[i].sum()), uid=str(uids[i]), goal=info[0], goal_set=info[1], env_id=info[2],
            agent_name=str(agents[i]) if agents[i] is not None else None,
            advantage=float(advantages[i][mask.bool()].mean()) if mask.any() else 0.0,
            before=before[i].double().numpy(),
        ))  # fmt: skip
    return trajectories


def install_verl09() -> None:
    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.workers.utils.padding import response_from_nested

    if getattr(PPOTrainer._update_actor, "agentrl_rehearsal", False):
        return
    update_actor, setup = PPOTrainer._update_actor, PPOTrainer._setup
    fields = ["prompts", "responses", "response_mask", "rm_scores", "advantages", "old_log_probs", "uid",
              "extra_info", "agent_name", "data_source"]  # fmt: skip

    def _update_actor(self: Any, batch: Any, metrics: dict) -> Any:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        trajectories = trajectories_verl09(data)
        output = update_actor(self, batch, metrics)
        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                                 "temperature": self.config.actor_rollout_ref.rollout.temperature})  # fmt: skip
        self.actor_rollout_wg.compute_log_prob(batch)
        after = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                select_fields=["log_probs", "response_mask"])  # fmt: skip
        rows = list(response_from_nested(after["log_probs"], after["response_mask"]).unbind())
        for trajectory, row in zip(trajectories, rows, strict=True):
            trajectory.after = row[: len(trajectory.before)].double().numpy()
        checker().check_step(self, int(self.global_steps), trajectories)
        return output

    def _setup(self: Any) -> Any:
        output = setup(self)
        _watch_syncs(self, "0.9")
        return output

    _update_actor.agentrl_rehearsal = True  # type: ignore[attr-defined]
    PPOTrainer._update_actor = _update_actor
    PPOTrainer._setup = _setup


# ---- both ----------------------------------------------------------------------------------------------------
def _goal(extra: Any, data_source: Any = None) -> tuple[int | None, str | None, str | None]:
    """A row's task, goal set and environment (``extra_info`` as the dataset wrote it: ``task`` or ``goal``, also
    in ``interaction_kwargs``; the environment from ``env``, the interaction's ``name`` or the row's
    ``data_source``)."""
    extra = dict(extra or {})
    kwargs = dict(extra.get("interaction_kwargs") or {})
    goal = next((v for v in (extra.get("task"), extra.get("goal"), kwargs.get("task"), kwargs.get("goal"))
                 if v is not None), None)  # fmt: skip
    env = extra.get("env") or (str(data_source) if data_source is not None else None)
    return ((int(goal) if goal is not None else None), (extra.get("goal_set") or kwargs.get("goal_set")),
            str(env) if env else None)  # fmt: skip


def _watch_syncs(trainer: Any, line: str) -> None:
    """Check every weight sync of ``trainer`` (its ``checkpoint_manager.update_weights``, sync or awaited)."""
    manager = trainer.checkpoint_manager
    original = manager.update_weights

    def global_steps_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        value = args[0] if args else kwargs.get("global_steps")
        return int(value) if value is not None else None

    def update_weights(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if inspect.isawaitable(result):

            async def then() -> Any:
                value = await result
                checker().check_sync(trainer, global_steps_of(args, kwargs), line)
                return value

            return then()
        checker().check_sync(trainer, global_steps_of(args, kwargs), line)
        return result

    manager.update_weights = update_weights


def install(line: str) -> None:
    """The checks for the installed line, when the rehearsal asked for them."""
    if not os.environ.get(ENV):
        return
    install_verl07() if line == "0.7" else install_verl09()
