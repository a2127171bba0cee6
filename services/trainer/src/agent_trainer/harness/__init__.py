"""The local harness: what every CPU run of the training path runs against, in one place.

``agent-train preflight``, ``agent-train rehearse`` and ``make learn`` each check a piece of the real training path
on CPU, and they need the same surroundings: the env service (a running one that serves the run's catalog, else
replicas + nginx of its own: :mod:`.cluster`), a WebShop catalog (:mod:`.catalog`), tasks a scripted oracle is
known to solve (:mod:`.tasks`), model servers that stand in for sglang (:mod:`.model_servers`) and verl's own
agent-loop worker run in this process (:mod:`.verl_local`). They live here, below the runs that use them, so a run
imports the harness and never another run's internals (the preflight and the rehearsal used to import each
other's private helpers); ``scripts/import_graph.py`` checks that nothing here imports a run.

The names below are for everyone else (tests, a notebook); the package's own modules import the harness's modules
themselves (``from ..harness.cluster import start_cluster``), so the import graph shows which piece each uses. Each
name loads its module on first use: the cluster, the catalog and the tasks need neither torch nor verl, and a
driver that only starts a cluster must not import verl (which configures logging as it loads).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: Each public name of the harness and the module that defines it.
_MODULE_OF = {
    "HarnessError": "errors",
    "Cluster": "cluster",
    "get_json": "cluster",
    "start_cluster": "cluster",
    "start_or_reuse_env_cluster": "cluster",
    "default_catalog": "catalog",
    "pick_env_tasks": "tasks",
    "pick_oracle_goals": "tasks",
    "ASSISTANT_TURN": "model_servers",
    "PlanByOpeningServer": "model_servers",
    "ScriptedServer": "model_servers",
    "StandInServer": "model_servers",
    "TinyModelServer": "model_servers",
    "LocalAgentLoopWorker": "verl_local",
    "LocalLoadBalancer": "verl_local",
    "LocalRemote": "verl_local",
    "LocalRewardHandle": "verl_local",
    "generation_batch": "verl_local",
    "local_transfer_queue": "verl_local",
    "run_tq_rollouts": "verl_local",
    "step_metrics_v07": "verl_local",
    "summarize_output": "verl_local",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """``agent_trainer.harness.<name>``: the name from its module, imported now if it was not yet."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
