"""verl 0.7.1's ``main_ppo`` plus per-step training metrics of each environment: ``python -m agent_trainer.verl_main``
(on verl 0.8+ it runs verl's own ``main_ppo`` unchanged).

verl 0.7.1 logs the reward function's extra keys (success, env steps, invalid actions) only at validation
(``val-aux/<data_source>/success/mean@1``); on training steps they reach ``batch.non_tensor_batch`` and are dropped.
This entry point is verl's own ``main_ppo`` (same Hydra composition, same ``run_ppo``), with a ``TaskRunner``
subclass, verl's documented hook for recipes (``run_ppo(config, task_runner_class=...)``), that adds the
means of those keys to every step's metrics, so the metrics log and TensorBoard show them per training step:

    <env>/success/mean, <env>/env_reward/mean, <env>/purchased/mean, <env>/steps/mean,
    <env>/invalid_actions/mean, <env>/invalid_rate/mean

for each environment of the step (the rows' ``data_source``: ``webshop/success/mean``, the guides' name, in a
WebShop run), and the same under ``env/`` on both verl lines (:func:`env_step_metrics`), so a run that mixes
environments shows each one's figures at every step:

    env/<env>/reward_mean, env/<env>/success_rate, env/<env>/steps_mean, env/<env>/invalid_rate,
    env/<env>/score_mean, env/<env>/trajectories

verl 0.9.1 (v1 trainer) keeps the agent loop's ``reward_extra_info`` in each trajectory's ``extra_fields`` in
TransferQueue and logs none of it on training steps: there the task runner (``WebshopTaskRunnerV1``) extends the
v1 trainer's ``_compute_metrics`` with these per-environment metrics (:func:`install_env_step_metrics_v1`).

It also makes a resume from a checkpoint taken at an epoch's end train the next epoch (:func:`install_epoch_resume`):
verl 0.7.1 saves the dataloader's state right after the epoch's last batch, before its iterator is exhausted, and
restoring that state gives the next epoch 0 batches, so ``trainer.total_epochs=N+1`` on a finished run trained
nothing and exited 0. verl 0.9.1 re-iterates on StopIteration and does not need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import hydra
import numpy as np

from .reward import METRIC_KEYS

# The reward function's keys that become per-step metrics (``score`` is verl's own critic/score/mean).
STEP_METRIC_KEYS = tuple(k for k in METRIC_KEYS if k != "score")
#: The prefix of rows without a ``data_source`` (verl's own word for them at validation).
UNKNOWN_SOURCE = "unknown"


def step_metrics(non_tensor_batch: Mapping[str, Any]) -> dict[str, float]:
    """``<env>/<key>/mean`` of every reward-function key present in one training batch, per environment: the
    rows' ``data_source``, as verl names the same figures at validation (``val-aux/<data_source>/<key>/mean@1``).
    A WebShop run's are ``webshop/success/mean`` and so on, the names the guides use; a BabyAI run's
    ``babyai/success/mean`` (they were ``webshop/...`` for every environment, and a mix's were one mean of all).
    A value that is missing (None) or not a finite number is left out of its mean."""
    columns = {key: non_tensor_batch[key] for key in STEP_METRIC_KEYS if key in non_tensor_batch}
    if not columns:
        return {}
    sources = non_tensor_batch.get("data_source")
    if sources is None:
        sources = [None] * len(next(iter(columns.values())))
    return {
        f"{env}/{key}/mean": mean
        for env, (_, means) in means_by_source(sources, columns).items()
        for key, mean in means.items()
    }


ENV_METRIC_PREFIX = "env"
#: ``env/<env>/<name>`` <- the mean of this ``reward_extra_info`` key over the step's trajectories of ``<env>``.
ENV_METRICS = (("reward_mean", "env_reward"), ("success_rate", "success"), ("steps_mean", "steps"),
               ("invalid_rate", "invalid_rate"), ("score_mean", "score"))  # fmt: skip


def env_step_metrics(data_sources: Sequence[Any], infos: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    """Per environment (``data_sources``: one per trajectory, the rows' ``data_source``), the means of the
    trajectories' ``reward_extra_info`` columns (``infos``: key -> one value per trajectory) as
    ``env/<env>/<name>`` (:data:`ENV_METRICS`), and ``env/<env>/trajectories``. A value that is missing (None)
    or not a finite number is left out of its mean; a key absent from ``infos`` gives no metric."""
    metrics: dict[str, float] = {}
    for env, (trajectories, means) in means_by_source(data_sources, infos).items():
        metrics[f"{ENV_METRIC_PREFIX}/{env}/trajectories"] = float(trajectories)
        for name, key in ENV_METRICS:
            if key in means:
                metrics[f"{ENV_METRIC_PREFIX}/{env}/{name}"] = means[key]
    return metrics


def means_by_source(
    data_sources: Sequence[Any], columns: Mapping[str, Sequence[Any]]
) -> dict[str, tuple[int, dict[str, float]]]:
    """Per environment (the rows' ``data_source``; :data:`UNKNOWN_SOURCE` where a row has none): its number of
    rows and the mean of each column over them, values that are missing or not finite left out (a column with
    none left gives no mean). Raises ValueError for a column of another length than ``data_sources``."""
    sources = [UNKNOWN_SOURCE if s is None else str(s) for s in data_sources]
    for key, column in columns.items():
        if len(column) != len(sources):
            raise ValueError(f"{key}: {len(column)} values for {len(sources)} trajectories")
    grouped: dict[str, tuple[int, dict[str, float]]] = {}
    for env in sorted(set(sources)):
        rows = [i for i, s in enumerate(sources) if s == env]
        means: dict[str, float] = {}
        for key, column in columns.items():
            values = [v for v in (_finite(column[i]) for i in rows) if v is not None]
            if values:
                means[key] = float(np.mean(values))
        grouped[env] = (len(rows), means)
    return grouped


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def install_step_metrics() -> None:
    """Make verl's trainer loop add :func:`step_metrics` to the data metrics of each step (idempotent).

    ``RayPPOTrainer.fit`` calls the module-level name ``compute_data_metrics`` of ``ray_trainer`` once per
    step with the step's batch, after the reward's extra keys were put into ``batch.non_tensor_batch``.
    """
    from verl.trainer.ppo import ray_trainer

    original = ray_trainer.compute_data_metrics
    if getattr(original, "webshop_step_metrics", False):
        return

    def compute_data_metrics(batch: Any, use_critic: bool = True) -> dict[str, Any]:
        metrics = original(batch=batch, use_critic=use_critic)
        metrics.update(step_metrics(batch.non_tensor_batch))
        extra = batch.non_tensor_batch
        if "data_source" in extra:
            infos = {key: list(extra[key]) for _, key in ENV_METRICS if key in extra}
            metrics.update(env_step_metrics(list(extra["data_source"]), infos))
        return metrics

    compute_data_metrics.webshop_step_metrics = True  # type: ignore[attr-defined]
    ray_trainer.compute_data_metrics = compute_data_metrics


def install_env_step_metrics_v1() -> None:
    """verl 0.9.1: make the v1 trainer's ``PPOTrainer._compute_metrics`` (once per training step, after the step's
    update) add :func:`env_step_metrics` of the step's trajectories, read from TransferQueue (their
    ``data_source`` and ``extra_fields["reward_extra_info"]``, padding rows left out). Idempotent."""
    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    original = PPOTrainer._compute_metrics
    if getattr(original, "webshop_env_metrics", False):
        return

    def _compute_metrics(self: Any, batch: Any, metrics: dict, *args: Any, **kwargs: Any) -> Any:
        result = original(self, batch, metrics, *args, **kwargs)
        metrics.update(env_step_metrics_tq(tq, batch))
        return result

    _compute_metrics.webshop_env_metrics = True  # type: ignore[attr-defined]
    PPOTrainer._compute_metrics = _compute_metrics


def env_step_metrics_tq(tq: Any, batch: Any) -> dict[str, float]:
    """:func:`env_step_metrics` of a v1 batch (``KVBatchMeta``) from TransferQueue."""
    keep = [not tag.get("is_padding", False) for tag in batch.tags]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=["data_source", "extra_fields"])  # fmt: skip
    sources = [s for s, k in zip(_column(data["data_source"]), keep, strict=True) if k]
    fields = [f for f, k in zip(_column(data["extra_fields"]), keep, strict=True) if k]
    infos_rows = [
        dict((f or {}).get("reward_extra_info") or {}) if isinstance(f, Mapping) else {} for f in fields
    ]
    keys = {key for _, key in ENV_METRICS if any(key in row for row in infos_rows)}
    infos = {key: [row.get(key) for row in infos_rows] for key in keys}
    return env_step_metrics(sources, infos)


def _column(value: Any) -> list[Any]:
    """A TransferQueue non-tensor field as a list of rows."""
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


def finish_exhausted_epoch(dataloader: Any, state: Mapping[str, Any], steps_done: int) -> bool:
    """After ``dataloader.load_state_dict(state)``: if ``state`` was saved after the last batch of an epoch (``steps_done``
    a multiple of the epoch's batches), run the exhausted iterator to its end so that the next ``iter()`` starts
    the next epoch, with the sampler's random state where the uninterrupted run had it. Returns whether it did.

    Should the restored iterator still hold a batch (the state was not an epoch's end after all), the state is
    loaded again: nothing is skipped.
    """
    batches = len(dataloader)
    if steps_done <= 0 or batches <= 0 or steps_done % batches != 0:
        return False
    for _ in dataloader:  # an exhausted iterator yields nothing; the one after it is a fresh epoch
        dataloader.load_state_dict(state)
        return False
    return True


def install_epoch_resume() -> None:
    """Make ``RayPPOTrainer._load_checkpoint`` (verl 0.7.1) finish an exhausted epoch's dataloader state (see
    :func:`finish_exhausted_epoch`; idempotent)."""
    import os

    import torch
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    original = RayPPOTrainer._load_checkpoint
    if getattr(original, "webshop_epoch_resume", False):
        return

    def _load_checkpoint(self: Any) -> Any:
        result = original(self)
        if not self.global_steps:
            return result
        folder = os.path.join(
            os.path.abspath(self.config.trainer.default_local_dir), f"global_step_{self.global_steps}"
        )
        if self.config.trainer.resume_mode == "resume_path":
            folder = os.path.abspath(self.config.trainer.resume_from_path)
        path = os.path.join(folder, "data.pt")
        if os.path.exists(path):
            state = torch.load(path, weights_only=False)
            if finish_exhausted_epoch(self.train_dataloader, state, int(self.global_steps)):
                print(f"[webshop] resumed at step {self.global_steps}, the end of an epoch: the next epoch starts "
                      f"fresh ({len(self.train_dataloader)} batches)", flush=True)  # fmt: skip
        return result

    _load_checkpoint.webshop_epoch_resume = True  # type: ignore[attr-defined]
    _load_checkpoint.__wrapped__ = original  # type: ignore[attr-defined]
    RayPPOTrainer._load_checkpoint = _load_checkpoint


def _task_runner_class() -> Any:
    from verl.trainer.main_ppo import TaskRunner

    class WebshopTaskRunner(TaskRunner):  # type: ignore[misc, valid-type]
        """verl's TaskRunner; the trainer loop runs in this Ray actor, so the metrics are installed here."""

        def run(self, config: Any) -> Any:
            install_step_metrics()
            install_epoch_resume()
            return super().run(config)

    return WebshopTaskRunner


def _task_runner_class_v1() -> Any:
    from verl.trainer.main_ppo import TaskRunnerV1

    class WebshopTaskRunnerV1(TaskRunnerV1.__ray_actor_class__):  # type: ignore[misc, name-defined]
        """verl 0.9.1's v1 TaskRunner (the class its Ray actor runs); the trainer loop runs in this actor, so the
        per-environment step metrics are installed here."""

        def run(self, config: Any) -> Any:
            install_env_step_metrics_v1()
            return super().run(config)

    return WebshopTaskRunnerV1


@hydra.main(config_path=None, config_name=None, version_base=None)
def main_v1(config: Any) -> None:
    """What verl 0.9.1's ``main_ppo.main`` does (device, config validation, ``run_ppo``), with the task runner
    that adds the per-environment step metrics; the legacy (non-v1) trainer runs verl's own task runner."""
    import ray
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config))  # fmt: skip
    if config.trainer.use_v1:
        run_ppo(config, task_runner_class=ray.remote(_task_runner_class_v1()))
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner

        run_ppo(config, task_runner_class=TaskRunner)


@hydra.main(config_path=None, config_name=None, version_base=None)
def main(config: Any) -> None:
    """What ``verl.trainer.main_ppo.main`` does, with the WebShop task runner."""
    import ray
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    config = migrate_legacy_reward_impl(config)
    run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(_task_runner_class()))


def run() -> None:
    """verl 0.7.x: :func:`main`; verl 0.9: :func:`main_v1` (verl's ``main_ppo`` with the per-environment step
    metrics), so ``agent-train train`` launches through this module on either line."""
    from .config import installed_verl_line

    if installed_verl_line() == "0.7":
        main()
    else:
        main_v1()


if __name__ == "__main__":
    run()
