"""The GPU path's safety net, run on CPU: ``agent-train preflight``.

1. Compose each training config with Hydra as ``verl.trainer.main_ppo`` would (plus its legacy-reward
   migration), reject keys the stock verl config does not define (verl accepts misspelled YAML keys
   silently), check the batch divisibility rules and the multi-turn wiring, and run verl's ``validate_config``.
2. Open the catalog and build the tiny model the rollouts play with.
3. Start (or reuse) a local env cluster serving the run's environments: real replicas behind a real nginx.
4. Pick each environment's oracle tasks through its spec, write their rows as ``agent-train data --env`` does,
   load them with verl's own dataset class, and run verl's real ``AgentLoopWorker`` -> the environments' agent
   loops -> the reward on CPU (on verl 0.7.1 also ``ToolAgentLoop`` -> each environment's interaction -> the
   reward function): once with a tiny random model built locally, once with a scripted policy replaying the
   expert's actions, which must succeed on every trajectory.
5. Check the token streams, the per-step metrics, that every trajectory's state was opened and none is left
   behind; write ``summary.json``; exit non-zero on any failure.

One route and one layout for every run, WebShop alone as any environment or mix (:mod:`.run`, ``run_preflight``),
one module per stage: :mod:`.configs` (step 1), :mod:`.envs` (steps 2 to 5: the tasks, the rows and the stages),
:mod:`.rollouts` (the rollouts through verl's workers and the token-stream check), with :mod:`.options` and
:mod:`.summary` beside them. The cluster, the catalog, the oracle's tasks and the stand-in model servers are the
local harness's (:mod:`agent_trainer.harness`), shared with the rehearsal and ``make learn``.
"""

from __future__ import annotations

from .configs import (
    PreflightError,
    agent_loop_overrides,
    check_training_config,
    compose_stock_config,
    compose_training_config,
    env_config_names,
    preflight_configs,
)
from .envs import env_round_overrides, pick_plans
from .options import PreflightOptions
from .rollouts import token_stream_report
from .run import run_preflight
from .summary import line_dir

__all__ = [
    "PreflightError",
    "PreflightOptions",
    "agent_loop_overrides",
    "check_training_config",
    "compose_stock_config",
    "compose_training_config",
    "env_config_names",
    "env_round_overrides",
    "line_dir",
    "pick_plans",
    "preflight_configs",
    "run_preflight",
    "token_stream_report",
]
