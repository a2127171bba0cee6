#!/usr/bin/env python3
"""``make demo``: the whole loop on any machine (no GPU, no model, no download).

1. prepares the bundled catalog (generated in the original raw format) unless it is there already;
2. starts the local cluster: N env replicas behind a real nginx, on free ports (so it never collides with a
   ``make up-local`` cluster), run directory ``run/demo``;
3. evaluates the ``expert`` (the oracle) and ``random`` policies on the test split through the balancer, the
   two ends of the scale any trained model lands between;
4. evaluates the same two policies on every other environment the replicas serve (``ENVS=webshop,textcraft,...``:
   the first ``--env-tasks`` tasks of its test split), with ``agent-train eval --env``'s code
   (``evaluation.env_runner``: the trainer-side spec's prompts, parser and outcomes);
5. writes ``metrics.json``, ``trajectories.jsonl`` and ``report.html`` per policy (``outputs/demo/<policy>/``,
   other environments ``outputs/demo/<env>/<policy>/``) plus ``index.html`` comparing them, prints where they
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


def ensure_catalog(catalog: Path, raw: Path, products: int, seed: int) -> None:
    """Generate and prepare the bundled catalog when ``catalog`` holds none (what ``make data`` does)."""
    if (catalog / "manifest.json").exists():
        print(f"catalog: {catalog} (already prepared)")
        return
    from webshop_env.envs.webshop.catalog.generate import generate_catalog
    from webshop_env.envs.webshop.catalog.prepare import prepare_catalog

    print(f"catalog: generating {products} products (seed {seed}) into {raw}, preparing {catalog}")
    generate_catalog(raw, products=products, seed=seed, progress=True)
    prepare_catalog(raw, catalog, progress=True)


def reward_definition(results: dict[str, Any]) -> str:
    """The catalog's reward definition (title nouns, prices, ceilings), the same for every policy here."""
    from webshop_env.envs.webshop.catalog.fidelity import describe_fidelity

    catalog = next(iter(results.values())).metrics["catalog"]
    return f"catalog {catalog['fingerprint']}: {describe_fidelity(catalog['fidelity'])}"


def env_rows(others: dict[str, dict[str, Any]]) -> str:
    """The other environments' rows of the index: success and mean reward with their 95 % intervals per policy."""
    rows = []
    for env_id, policies in others.items():
        for name, result in policies.items():
            m = result.metrics
            lo, hi = m["success_rate_ci95"]
            rows.append(
                f"<tr><td>{html.escape(env_id)}</td><td><a href='{html.escape(env_id)}/{html.escape(name)}/report.html'>"
                f"{html.escape(name)}</a></td><td>{100 * m['success_rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]</td>"
                f"<td>{m['mean_reward']:.3f}</td><td>{m['episodes']}</td><td>{m['mean_steps']:.2f}</td>"
                f"<td>{100 * m['invalid_action_rate']:.1f} %</td></tr>"
            )
    if not rows:
        return ""
    return (
        "<h2>The other environments</h2><p>The first tasks of each test split (the training data's split), "
        "through the same balancer, with the trainer's prompts, parser and success rule per environment.</p>"
        "<table><tr><th>environment</th><th>policy</th><th>success (95% CI)</th><th>mean reward</th>"
        f"<th>episodes</th><th>mean steps</th><th>invalid actions</th></tr>{''.join(rows)}</table>"
    )


def index_page(results: dict[str, Any], split: str, others: dict[str, dict[str, Any]] | None = None) -> str:
    """A one-table page comparing the policies, linking to their reports (and one for the other environments)."""
    rows = []
    for name, result in results.items():
        m = result.metrics
        rows.append(
            f"<tr><td><a href='{html.escape(name)}/report.html'>{html.escape(name)}</a></td>"
            f"<td>{m['score']:.1f} [{m['score_ci95'][0]:.1f}, {m['score_ci95'][1]:.1f}]</td>"
            f"<td>{100 * m['success_rate']:.1f} %</td><td>{m['episodes']}</td><td>{m['mean_steps']:.2f}</td>"
            f"<td>{100 * m['invalid_action_rate']:.1f} %</td></tr>"
        )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>WebShop demo</title><style>"
        "body{font:15px/1.5 system-ui,sans-serif;margin:32px;color:#111827}td,th{padding:6px 16px 6px 0;"
        "text-align:left;border-bottom:1px solid #e5e7eb}</style></head><body>"
        "<h1>WebShop demo: the scale</h1>"
        f"<p>Policies evaluated on the {html.escape(split)} split of the bundled catalog through the local "
        "cluster (replicas behind nginx). A trained model lands between the two.</p>"
        f"<p>Reward definition: {html.escape(reward_definition(results))}</p>"
        "<table><tr><th>policy</th>"
        "<th>score (95% CI)</th><th>success</th><th>episodes</th><th>mean steps</th><th>invalid actions</th>"
        f"</tr>{''.join(rows)}</table>{env_rows(others or {})}</body></html>\n"
    )


def other_environments(
    url: str, out: Path, tasks: int, split: str, concurrency: int, progress: bool
) -> dict[str, dict[str, Any]]:
    """Expert and random evaluations of every enabled environment besides WebShop (``WEBSHOP_ENVS`` / ``ENVS=``),
    by ``agent-train eval --env``'s runner: ``{env: {policy: EvalResult}}``."""
    import asyncio

    from agent_trainer.evaluation.env_runner import default_rounds, evaluate_env_async
    from agent_trainer.evaluation.runner import EvalConfig, PolicySpec

    results: dict[str, dict[str, Any]] = {}
    for env_id in os.environ.get("WEBSHOP_ENVS", "webshop").split(","):
        env_id = env_id.strip()
        if not env_id or env_id == "webshop":
            continue
        results[env_id] = {}
        for policy in ("expert", "random"):
            config = EvalConfig(out=out / env_id / policy, url=url, split=split, max_samples=tasks,
                                max_turns=default_rounds(env_id), concurrency=concurrency, overwrite=True,
                                progress=progress)  # fmt: skip
            results[env_id][policy] = asyncio.run(evaluate_env_async(config, PolicySpec(name=policy), env_id))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="WebShop demo: catalog, local cluster, expert + random eval."
    )
    parser.add_argument("--catalog", type=Path, default=Path(os.environ.get("CATALOG_DIR", "data/catalog")))
    parser.add_argument(
        "--raw", type=Path, default=Path("data/raw/generated"), help="where to generate raw data"
    )
    parser.add_argument("--products", type=int, default=2000, help="products to generate when preparing")
    parser.add_argument("--catalog-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/demo"))
    parser.add_argument("--split", default="test", choices=("test", "eval", "train"))
    parser.add_argument("--max-samples", type=int, default=None, help="goals per policy (default: the split)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per replica")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--run-dir", type=Path, default=REPO / "run" / "demo")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--env-tasks",
        type=int,
        default=40,
        help="tasks per policy for the other enabled environments (ENVS=webshop,textcraft,...)",
    )
    args = parser.parse_args(argv)

    from agent_trainer.evaluation.runner import EvalConfig, EvalError, PolicySpec, evaluate
    from webshop_env import cluster

    started = time.monotonic()
    ensure_catalog(args.catalog.resolve(), args.raw.resolve(), args.products, args.catalog_seed)
    try:
        record = cluster.up(
            replicas=args.replicas,
            catalog=args.catalog,
            base_port=0,
            port=0,
            workers=args.workers,
            run_dir=args.run_dir,
            timeout=120,
            quiet=True,
        )
    except cluster.ClusterError as error:
        print(f"demo: {error}", file=sys.stderr)
        return 1
    print(cluster.describe(record))
    results: dict[str, Any] = {}
    try:
        for policy in ("expert", "random"):
            config = EvalConfig(
                out=args.out / policy,
                url=record["url"],
                split=args.split,
                max_samples=args.max_samples,
                concurrency=args.concurrency,
                catalog=args.catalog,
                overwrite=True,
                progress=not args.no_progress,
            )
            results[policy] = evaluate(config, PolicySpec(name=policy, seed=0))
        others = other_environments(
            record["url"], args.out, args.env_tasks, args.split, args.concurrency, not args.no_progress
        )
    except EvalError as error:
        print(f"demo: evaluation failed: {error}", file=sys.stderr)
        return 1
    finally:
        cluster.down(args.run_dir, quiet=True)
        print("cluster stopped")

    index = args.out / "index.html"
    index.write_text(index_page(results, args.split, others))
    summary = {
        name: {k: r.metrics[k] for k in ("score", "success_rate", "episodes", "mean_steps")}
        for name, r in results.items()
    }
    summary |= {
        env_id: {
            name: {k: r.metrics[k] for k in ("success_rate", "mean_reward", "episodes", "mean_steps")}
            for name, r in policies.items()
        }
        for env_id, policies in others.items()
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"\nWebShop demo ({args.split} split, {time.monotonic() - started:.0f} s; {reward_definition(results)}):"
    )
    for name, result in results.items():
        m = result.metrics
        print(
            f"  {name:<7} score {m['score']:5.1f}  success {100 * m['success_rate']:5.1f} %  "
            f"episodes {m['episodes']}  mean steps {m['mean_steps']:.2f}"
        )
    for env_id, policies in others.items():
        print(f"\n{env_id} (first {args.env_tasks} tasks of its {args.split} split, through the balancer):")
        for name, result in policies.items():
            m = result.metrics
            print(
                f"  {name:<7} success {100 * m['success_rate']:5.1f} %  mean reward {m['mean_reward']:.3f}  "
                f"episodes {m['episodes']}  mean steps {m['mean_steps']:.2f}"
            )
    print("reports:")
    print(f"  {index.resolve()}")
    for name, result in results.items():
        print(f"  {result.report_path.resolve()}   ({name}; metrics.json and trajectories.jsonl beside it)")
    for env_id, policies in others.items():
        for name, result in policies.items():
            print(f"  {result.report_path.resolve()}   ({env_id}, {name})")
    finished = [*results.values(), *(r for policies in others.values() for r in policies.values())]
    return 0 if all(r.complete for r in finished) else 1


if __name__ == "__main__":
    sys.exit(main())
