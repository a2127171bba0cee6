"""``agent-train eval --env a,b,c``: a mix of environments, each evaluated by ``runner`` (the one path that plays any
environment through its spec) with one policy (an LLM server starts once).

A mix (``--env textcraft,babyai,webshop``) evaluates each environment into ``OUT/<env>/`` with its training budget
(rounds, tokens per reply, response tokens: ``budget.training_budget``), then writes ``OUT/metrics.json``
(``metrics.summarize_mix`` and each environment's summary) and ``OUT/report.html`` (a table per environment, its
charts, and one episode browser over every environment's episodes).

The names that used to live here (``evaluate_env_async``, ``env_tasks``, ``build_env_policy``, ...) are
``runner``'s, re-exported for their importers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .budget import training_budget
from .metrics import summarize_mix
from .policies import Policy
from .runner import (
    METRICS,
    POOL_TASKS,
    REPORT,
    SPLIT_OF,
    TRAJECTORIES,
    EvalConfig,
    EvalResult,
    PlanOf,
    PolicySpec,
    build_env_policy,
    build_policy,
    env_tasks,
    evaluate_async,
    expert_plan,
    instruction_of,
    plan_source,
)

__all__ = ["POOL_TASKS", "SPLIT_OF", "PlanOf", "build_env_policy", "default_rounds", "env_tasks", "evaluate_env_async",
           "evaluate_envs_async", "expert_plan", "instruction_of", "plan_source", "write_mix"]  # fmt: skip


async def evaluate_env_async(config: EvalConfig, spec: PolicySpec, env_id: str, policy: Policy | None = None
                             ) -> EvalResult:  # fmt: skip
    """Run (or resume) the evaluation of ``env_id`` into ``config.out`` (``runner.evaluate_async``)."""
    return await evaluate_async(config, spec, policy=policy, env_id=env_id)


async def evaluate_envs_async(config: EvalConfig, spec: PolicySpec, env_ids: Sequence[str]) -> EvalResult:
    """``--env``: one environment into ``config.out``; several into ``config.out/<env>`` plus the mix's
    ``metrics.json`` and ``report.html`` (see the module docstring)."""
    env_ids = list(env_ids)
    if len(env_ids) == 1:
        return await evaluate_async(config, spec, env_id=env_ids[0])
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    shared: Policy | None = None
    if spec.name in ("openai", "checkpoint"):  # one model server for every environment
        shared = build_policy(spec, None, None, out)  # type: ignore[arg-type]
        await shared.start()
    results: dict[str, EvalResult] = {}
    try:
        for env_id in env_ids:
            sub = replace(config, out=out / env_id, max_turns=_rounds(config, env_id))
            results[env_id] = await evaluate_async(sub, spec, policy=shared, env_id=env_id)
    finally:
        if shared is not None:
            await shared.close()
    return write_mix(out, results, config.write_report)


def _rounds(config: EvalConfig, env_id: str) -> int:
    """The round budget of ``env_id`` in a mix: ``config.max_turns`` when it was given (``explicit_turns``), else
    the environment's own (its spec's rounds; WebShop's ``TRAINING_ENV_STEPS``)."""
    if config.explicit_turns:
        return config.max_turns
    return default_rounds(env_id)


def default_rounds(env_id: str) -> int:
    """Rounds per episode training allows ``env_id`` (its test config's; WebShop: verl's turn limit less one)."""
    return training_budget(env_id).rounds


def write_mix(out: Path, results: Mapping[str, EvalResult], write_report: bool = True) -> EvalResult:
    """The mix's ``metrics.json`` (``summarize_mix`` plus each environment's summary) and ``report.html``."""
    per_env = {env_id: r.metrics for env_id, r in results.items()}
    metrics: dict[str, Any] = {**summarize_mix(per_env), "complete": all(r.complete for r in results.values()),
                               "dirs": {env_id: env_id for env_id in results}, "created_unix": int(time.time()),
                               "policy": next(iter(per_env.values())).get("policy")}  # fmt: skip
    (out / METRICS).write_text(json.dumps(metrics, indent=2) + "\n")
    if write_report:
        from .report_html import load_records, write_mix_report

        records = {env_id: load_records(r.out / TRAJECTORIES) for env_id, r in results.items()}
        write_mix_report(out / REPORT, metrics, per_env, records)
    failures = [f | {"env": env_id} for env_id, r in results.items() for f in r.failures]
    return EvalResult(metrics=metrics, out=out, complete=bool(metrics["complete"]), failures=failures)
