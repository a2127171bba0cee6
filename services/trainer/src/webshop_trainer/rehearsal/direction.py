"""Does the update go the right way? Around the trainer's own actor update, the log-probabilities of the step's
sampled responses are taken under the actor before the update (the trainer's ``old_log_probs``) and after it
(the actor worker group's ``compute_log_prob`` on the same batch), and written with the responses' advantages
to ``$WEBSHOP_REHEARSAL_DIRECTION`` (one JSON line per step): responses with a positive advantage should have
become more likely, negative ones less, on average.

Installed in the trainer's process by the rehearsal's setup hook when that variable is set: verl 0.7.1's
``RayPPOTrainer._update_actor``, verl 0.9.1's v1 ``PPOTrainer._update_actor`` (the step's data in TransferQueue).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

ENV = "WEBSHOP_REHEARSAL_DIRECTION"


def summarize(before: list[torch.Tensor], after: list[torch.Tensor], advantages: list[float], step: int
              ) -> dict[str, Any]:  # fmt: skip
    """Per response: the mean change of its tokens' log-probability; then the means by the advantage's sign."""
    changes = [float((a - b).mean()) for b, a in zip(before, after, strict=True)]
    positive = [c for c, adv in zip(changes, advantages, strict=True) if adv > 0]
    negative = [c for c, adv in zip(changes, advantages, strict=True) if adv < 0]
    return {"step": step, "responses": len(changes), "positive": len(positive), "negative": len(negative),
            "positive_mean_change": _mean(positive), "negative_mean_change": _mean(negative),
            "advantage_weighted_change": sum(c * a for c, a in zip(changes, advantages, strict=True))}  # fmt: skip


def right_way(record: dict[str, Any]) -> bool:
    """Both signs present; positive-advantage responses became more likely than negative-advantage ones (their
    mean change is higher), and the advantage-weighted change, what the policy-gradient step increases to first
    order, is positive. The two groups are compared with each other: an update can also move every sampled
    response's log-probability by the same small amount (verl 0.9.1 does: all slightly down), which says nothing
    about the sign of the reward-to-gradient pipe. ``strict_way`` asks for the absolute signs too."""
    return bool(record["positive"] and record["negative"]
                and record["positive_mean_change"] > record["negative_mean_change"]
                and record["advantage_weighted_change"] > 0)  # fmt: skip


def strict_way(record: dict[str, Any]) -> bool:
    """:func:`right_way`, and positive-advantage responses more likely, negative ones less, in absolute terms."""
    return right_way(record) and record["positive_mean_change"] > 0 > record["negative_mean_change"]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _write(record: dict[str, Any]) -> None:
    with open(os.environ[ENV], "a") as out:
        out.write(json.dumps(record) + "\n")
    print(f"[rehearsal] update direction: {record}", flush=True)


def _per_response(values: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    return [row[m.bool()] for row, m in zip(values, mask, strict=True)]


def install_verl07() -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    original = RayPPOTrainer._update_actor
    if getattr(original, "webshop_rehearsal", False):
        return

    def _update_actor(self: Any, batch: Any) -> Any:
        output = original(self, batch)
        after, _ = self._compute_old_log_prob(batch)
        mask = batch.batch["response_mask"]
        advantages = [
            float(row[m.bool()].mean()) for row, m in zip(batch.batch["advantages"], mask, strict=True)
        ]
        _write(summarize(_per_response(batch.batch["old_log_probs"], mask),
                         _per_response(after.batch["old_log_probs"], mask), advantages, int(self.global_steps)))  # fmt: skip
        return output

    _update_actor.webshop_rehearsal = True  # type: ignore[attr-defined]
    RayPPOTrainer._update_actor = _update_actor


def install_verl09() -> None:
    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.workers.utils.padding import response_from_nested

    original = PPOTrainer._update_actor
    if getattr(original, "webshop_rehearsal", False):
        return

    def _update_actor(self: Any, batch: Any, metrics: dict) -> Any:
        fields = ["old_log_probs", "advantages", "response_mask"]
        before = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        output = original(self, batch, metrics)
        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                                 "temperature": self.config.actor_rollout_ref.rollout.temperature})  # fmt: skip
        self.actor_rollout_wg.compute_log_prob(batch)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["log_probs", "response_mask"])  # fmt: skip
        after = list(response_from_nested(data["log_probs"], data["response_mask"]).unbind())
        old = list(before["old_log_probs"].unbind())
        advantages = [float(row.mean()) for row in before["advantages"].unbind()]
        _write(summarize(old, [a[: len(o)] for a, o in zip(after, old, strict=True)], advantages,
                         int(self.global_steps)))  # fmt: skip
        return output

    _update_actor.webshop_rehearsal = True  # type: ignore[attr-defined]
    PPOTrainer._update_actor = _update_actor


def install(line: str) -> None:
    """The wrapper for the installed line, when the rehearsal asked for it."""
    if not os.environ.get(ENV):
        return
    install_verl07() if line == "0.7" else install_verl09()
