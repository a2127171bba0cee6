#!/usr/bin/env python3
"""``make demo``: the whole loop on any machine (no GPU, no model, no download), for any environments.

1. where ENVS serves WebShop, prepares its bundled catalog (generated in the original raw format) unless it is there;
2. starts the local cluster serving the environments ``ENVS=...`` names (``AGENTRL_ENVS`` in the shell; default
   ``webshop``): N env replicas behind a real nginx, on free ports (so it never collides with a ``make up-local``
   cluster), run directory ``run/demo``;
3. evaluates the ``expert`` (each environment's solver or oracle) and ``random`` policies on the first
   ``--max-samples`` tasks of every environment's test split through the balancer, with ``agent-train eval``'s
   code: the two ends of the scale any trained model lands between;
4. writes ``metrics.json``, ``trajectories.jsonl`` and ``report.html`` per environment and policy
   (``outputs/demo/<env>/<policy>/``) plus ``index.html`` comparing them and ``summary.json``, prints where they
   are, and stops the cluster (also on errors and Ctrl-C).

    python scripts/demo.py [--catalog data/catalog] [--out outputs/demo] [--max-samples N] [--replicas 2]
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("agent_trainer") is None:  # the eval code needs no verl: use the checkout
    sys.path.insert(0, str(REPO / "services" / "trainer" / "src"))

POLICIES = ("expert", "random")
DEFAULT_TASKS = 100


def ensure_catalog(catalog: Path, raw: Path, products: int, seed: int) -> None:
    """Generate and prepare the bundled catalog when ``catalog`` holds none (what ``make data`` does)."""
    if (catalog / "manifest.json").exists():
        print(f"catalog: {catalog} (already prepared)")
        return
    from agent_envs.envs.webshop.catalog.generate import generate_catalog
    from agent_envs.envs.webshop.catalog.prepare import prepare_catalog

    print(f"catalog: generating {products} products (seed {seed}) into {raw}, preparing {catalog}")
    generate_catalog(raw, products=products, seed=seed, progress=True)
    prepare_catalog(raw, catalog, progress=True)


def demo_envs() -> list[str]:
    """The environments to play: ``AGENTRL_ENVS`` (``make demo ENVS=...`` exports it), in order, without repeats."""
    named = [e.strip() for e in os.environ.get("AGENTRL_ENVS", "webshop").split(",")]
    return list(dict.fromkeys(e for e in named if e)) or ["webshop"]


def reward_definition(metrics: dict[str, Any]) -> str | None:
    """The catalog's reward definition (title nouns, prices, ceilings) where the environment has one (WebShop's
    metrics carry their catalog), else None."""
    catalog = metrics.get("catalog")
    if not isinstance(catalog, dict) or "fidelity" not in catalog:
        return None
    from agent_envs.envs.webshop.catalog.fidelity import describe_fidelity

    return f"catalog {catalog['fingerprint']}: {describe_fidelity(catalog['fidelity'])}"


def index_page(results: dict[str, dict[str, Any]], split: str) -> str:
    """A one-table page comparing the policies on every environment, linking to their reports."""
    rows, notes = [], []
    for env_id, policies in results.items():
        for name, result in policies.items():
            m = result.metrics
            lo, hi = m["success_rate_ci95"]
            link = f"{html.escape(env_id)}/{html.escape(name)}/report.html"
            rows.append(
                f"<tr><td>{html.escape(env_id)}</td><td><a href='{link}'>{html.escape(name)}</a></td>"
                f"<td>{100 * m['success_rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]</td>"
                f"<td>{m['mean_reward']:.3f}</td><td>{m['episodes']}</td><td>{m['mean_steps']:.2f}</td>"
                f"<td>{100 * m['invalid_action_rate']:.1f} %</td></tr>"
            )
        definition = reward_definition(next(iter(policies.values())).metrics)
        if definition:
            notes.append(f"<p>{html.escape(env_id)}'s reward definition: {html.escape(definition)}</p>")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Demo</title><style>"
        "body{font:15px/1.5 system-ui,sans-serif;margin:32px;color:#111827}td,th{padding:6px 16px 6px 0;"
        "text-align:left;border-bottom:1px solid #e5e7eb}</style></head><body>"
        "<h1>Demo: the scale</h1>"
        f"<p>The expert and a random policy on the first tasks of each environment's {html.escape(split)} split, "
        "through the local cluster (replicas behind nginx), with the trainer's prompts, parser and success rule per "
        "environment. A trained model lands between the two.</p>"
        f"{''.join(notes)}<table><tr><th>environment</th><th>policy</th><th>success (95% CI)</th>"
        "<th>mean reward</th><th>episodes</th><th>mean steps</th><th>invalid actions</th></tr>"
        f"{''.join(rows)}</table></body></html>\n"
    )


def play(env_ids: Sequence[str], url: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Expert and random evaluations of every environment by ``agent-train eval``'s runner:
    ``{env: {policy: EvalResult}}``."""
    from agent_trainer.evaluation.env_runner import default_rounds
    from agent_trainer.evaluation.runner import EvalConfig, PolicySpec, evaluate

    results: dict[str, dict[str, Any]] = {}
    for env_id in env_ids:
        results[env_id] = {}
        for policy in POLICIES:
            config = EvalConfig(out=args.out / env_id / policy, url=url, split=args.split,
                                max_samples=args.max_samples or None, max_turns=default_rounds(env_id),
                                concurrency=args.concurrency, catalog=args.catalog, overwrite=True,
                                progress=not args.no_progress)  # fmt: skip
            results[env_id][policy] = evaluate(config, PolicySpec(name=policy, seed=0), env_id)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Demo: the local cluster serving ENVS (AGENTRL_ENVS), the expert and a random policy on each "
        "environment's test split, HTML reports."
    )
    parser.add_argument("--catalog", type=Path, default=Path(os.environ.get("CATALOG_DIR", "data/catalog")),
                        help="WebShop's prepared catalog (generated and prepared here when missing, where ENVS serves WebShop)")  # fmt: skip
    parser.add_argument(
        "--raw", type=Path, default=Path("data/raw/generated"), help="where to generate raw data"
    )
    parser.add_argument("--products", type=int, default=2000, help="products to generate when preparing")
    parser.add_argument("--catalog-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/demo"))
    parser.add_argument("--split", default="test", choices=("test", "eval", "train"))
    parser.add_argument("--max-samples", type=int, default=DEFAULT_TASKS,
                        help=f"tasks per policy and environment: the first N of its split (default {DEFAULT_TASKS}; "
                        "0: the whole split)")  # fmt: skip
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per replica")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--run-dir", type=Path, default=REPO / "run" / "demo")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.max_samples < 0:
        parser.error("--max-samples must be 0 (the whole split) or more")

    from agent_envs import cluster
    from agent_envs.envs import registry
    from agent_trainer.evaluation.runner import EvalError

    env_ids = demo_envs()
    started = time.monotonic()
    # data built here (WebShop's catalog), not shipped with a package: only where a served environment reads it
    if registry.with_prepared_data(env_ids):
        ensure_catalog(args.catalog.resolve(), args.raw.resolve(), args.products, args.catalog_seed)
    try:
        record = cluster.up(replicas=args.replicas, catalog=args.catalog, base_port=0, port=0, workers=args.workers,
                            run_dir=args.run_dir, timeout=120, quiet=True)  # fmt: skip
    except cluster.ClusterError as error:
        print(f"demo: {error}", file=sys.stderr)
        return 1
    print(cluster.describe(record))
    try:
        results = play(env_ids, record["url"], args)
    except EvalError as error:
        print(f"demo: evaluation failed: {error}", file=sys.stderr)
        return 1
    finally:
        cluster.down(args.run_dir, quiet=True)
        print("cluster stopped")

    index = args.out / "index.html"
    index.write_text(index_page(results, args.split))
    keys = ("success_rate", "mean_reward", "episodes", "mean_steps")
    summary = {env_id: {name: {k: r.metrics[k] for k in keys} for name, r in policies.items()}
               for env_id, policies in results.items()}  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    tasks = f"the first {args.max_samples} tasks" if args.max_samples else "every task"
    print(
        f"\nDemo ({tasks} of each {args.split} split, through the balancer, {time.monotonic() - started:.0f} s):"
    )
    for env_id, policies in results.items():
        definition = reward_definition(next(iter(policies.values())).metrics)
        print(f"{env_id}" + (f" ({definition})" if definition else "") + ":")
        for name, result in policies.items():
            m = result.metrics
            print(f"  {name:<7} success {100 * m['success_rate']:5.1f} %  "
                  f"mean reward {m['mean_reward']:.3f}  episodes {m['episodes']}  mean steps {m['mean_steps']:.2f}")  # fmt: skip
    print("reports:")
    print(f"  {index.resolve()}")
    for env_id, policies in results.items():
        for name, result in policies.items():
            print(
                f"  {result.report_path.resolve()}   ({env_id}, {name}; metrics.json and trajectories.jsonl beside it)"
            )
    return 0 if all(r.complete for policies in results.values() for r in policies.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
