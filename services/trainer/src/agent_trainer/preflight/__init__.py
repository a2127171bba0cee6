"""The GPU path's safety net, run on CPU: ``agent-train preflight``.

1. Compose each training config with Hydra as ``verl.trainer.main_ppo`` would (plus its legacy-reward
   migration), reject keys the stock verl config does not define (verl accepts misspelled YAML keys
   silently), check the batch divisibility rules and the multi-turn wiring, and run verl's ``validate_config``.
2. Build small parquet files and load them with verl's own dataset class and the tokenizer.
3. Start (or reuse) the local env cluster: real replicas behind a real nginx.
4. Run verl's real ``AgentLoopWorker`` -> ``ToolAgentLoop`` -> ``WebshopInteraction`` -> reward function path
   on CPU: once with a tiny random model built locally, once with a scripted policy replaying the oracle's
   actions, which must earn reward 1.0 through the reward function.
5. Check that no per-trajectory state is left behind; write ``summary.json``; exit non-zero on any failure.

One route for every environment and mix (:mod:`.run`, ``run_preflight``), one module per stage: :mod:`.configs`
(step 1), :mod:`.rollouts` (steps 4 and 5 of every stage), :mod:`.agent_loop` (the catalog run's agent loop, WebShop's),
:mod:`.envs` (each environment's tasks through its spec, and a run laid out per environment), with :mod:`.options`
and :mod:`.summary` beside them. The cluster, the catalog, the oracle's tasks
and the stand-in model servers are the local harness's (:mod:`agent_trainer.harness`), shared with the rehearsal
and ``make learn``.
"""

from __future__ import annotations

from .agent_loop import run_agent_loop_stage
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
    "run_agent_loop_stage",
    "run_preflight",
    "token_stream_report",
]
