"""verl 0.7.1's ``main_ppo`` plus WebShop's per-step training metrics: ``python -m webshop_trainer.verl_main``
(on verl 0.8+ it runs verl's own ``main_ppo`` unchanged).

verl 0.7.1 logs the reward function's extra keys (success, env steps, invalid actions) only at validation
(``val-aux/webshop/success/mean@1``); on training steps they reach ``batch.non_tensor_batch`` and are dropped.
This entry point is verl's own ``main_ppo`` (same Hydra composition, same ``run_ppo``), with a ``TaskRunner``
subclass, verl's documented hook for recipes (``run_ppo(config, task_runner_class=...)``), that adds the
means of those keys to every step's metrics, so the metrics log and TensorBoard show them per training step:

    webshop/success/mean, webshop/env_reward/mean, webshop/purchased/mean, webshop/steps/mean,
    webshop/invalid_actions/mean, webshop/invalid_rate/mean
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import hydra
import numpy as np

from .reward import METRIC_KEYS

STEP_METRIC_PREFIX = "webshop"
# The reward function's keys that become per-step metrics (``score`` is verl's own critic/score/mean).
STEP_METRIC_KEYS = tuple(k for k in METRIC_KEYS if k != "score")


def step_metrics(non_tensor_batch: Mapping[str, Any]) -> dict[str, float]:
    """``webshop/<key>/mean`` of every reward-function key present in one training batch."""
    metrics: dict[str, float] = {}
    for key in STEP_METRIC_KEYS:
        if key not in non_tensor_batch:
            continue
        values = np.asarray(non_tensor_batch[key], dtype=np.float64)
        if values.size:
            metrics[f"{STEP_METRIC_PREFIX}/{key}/mean"] = float(values.mean())
    return metrics


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
        return metrics

    compute_data_metrics.webshop_step_metrics = True  # type: ignore[attr-defined]
    ray_trainer.compute_data_metrics = compute_data_metrics


def _task_runner_class() -> Any:
    from verl.trainer.main_ppo import TaskRunner

    class WebshopTaskRunner(TaskRunner):  # type: ignore[misc, valid-type]
        """verl's TaskRunner; the trainer loop runs in this Ray actor, so the metrics are installed here."""

        def run(self, config: Any) -> Any:
            install_step_metrics()
            return super().run(config)

    return WebshopTaskRunner


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
    """verl 0.7.x: :func:`main`. Later lines (0.9: ``TaskRunnerV1``, validate_config in main) run verl's own
    ``main_ppo`` unchanged, so ``webshop-train train`` launches through this module on either line."""
    from .config import installed_verl_line

    if installed_verl_line() == "0.7":
        main()
    else:
        from verl.trainer.main_ppo import main as verl_main_ppo

        verl_main_ppo()


if __name__ == "__main__":
    run()
