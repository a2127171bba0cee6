"""In-process benchmark of the simulator: step latencies, catalog open time and resident memory.

Prints figures, asserts nothing: ``agent-envs bench --catalog DIR --json`` for one prepared catalog, or
``agent-envs bench --products 100000,1200000`` for generated catalogs of those sizes (generated and prepared
once into a cache directory, then reused), each measured in a fresh process.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .envs.webshop.catalog.store import open_catalog
from .envs.webshop.core.env import Step, WebShopEnv
from .envs.webshop.core.oracle import expert_actions


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1) of unsorted values; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _time_calls(fn: Callable[[int], Any], n: int) -> list[float]:
    timings = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        timings.append(time.perf_counter() - start)
    return timings


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_in_process(catalog_dir: Path, iterations: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Measure click, search and purchase steps on a prepared catalog (a search is never served from cache)."""
    rng = random.Random(seed)
    start = time.perf_counter()
    catalog = open_catalog(catalog_dir)
    env = WebShopEnv(catalog)
    goal_set = "human" if "human" in catalog.goal_sets else catalog.goal_sets[0]
    env.step(env.reset(0, goal_set=goal_set).state, "search[first query after opening]")
    open_s = time.perf_counter() - start  # open, plus what the first search needs (vocabulary, pages)
    goals = catalog.goal_count(goal_set)

    # An item page with options to click, reached the way an agent would.
    item_steps: list[tuple[Step, list[str]]] = []
    for goal in rng.sample(range(goals), min(goals, 50)):
        actions = expert_actions(env, goal, goal_set=goal_set)
        if not actions:
            continue
        step = env.reset(goal, goal_set=goal_set)
        for action in actions[:-1]:
            step = env.step(step.state, action)
        option_labels = [c for c in step.available_actions["clickables"][6:]] or ["description"]
        item_steps.append((step, option_labels))
    if not item_steps:
        raise RuntimeError("no goal of this catalog could be solved; cannot benchmark clicks")

    def click(i: int) -> None:
        step, labels = item_steps[i % len(item_steps)]
        env.step(step.state, f"click[{labels[i % len(labels)]}]")

    def purchase(i: int) -> None:
        step, _ = item_steps[i % len(item_steps)]
        env.step(step.state, "click[buy now]")

    # Search queries: instructions of random goals, made unique so that no search hits the result cache.
    searches = max(iterations // 4, 50)
    queries = [catalog.goal(goal_set, rng.randrange(goals)).instruction_text for _ in range(searches)]
    start_state = env.reset(0, goal_set=goal_set).state

    def search(i: int) -> None:
        env.step(start_state, f"search[{queries[i]} {i}]")

    click(0)
    purchase(0)
    clicks = _time_calls(click, iterations)
    search_times = _time_calls(search, searches)
    # The index alone, pruned (what a search step runs) against exhaustive scoring, interleaved query by
    # query so that both see the same machine load: their ratio is the pruning's speed-up.
    index = catalog.index
    pruned, exhaustive = [], []
    for i in range(searches):
        query = f"{queries[i]} {i}"
        pruned += _time_calls(lambda _, q=query: index.rank(q), 1)
        exhaustive += _time_calls(lambda _, q=query: index.rank_exhaustive(q), 1)
    purchases = _time_calls(purchase, max(iterations // 4, 50))
    us, ms = 1e6, 1e3
    return {
        "products": catalog.product_count,
        "goal_set": goal_set,
        "goals": goals,
        "click_us_p50": round(statistics.median(clicks) * us, 1),
        "click_us_p99": round(percentile(clicks, 0.99) * us, 1),
        "search_ms_p50": round(statistics.median(search_times) * ms, 3),
        "search_ms_p99": round(percentile(search_times, 0.99) * ms, 3),
        "index_search_ms_p50": round(statistics.median(pruned) * ms, 3),
        "index_search_ms_p99": round(percentile(pruned, 0.99) * ms, 3),
        "index_exhaustive_ms_p50": round(statistics.median(exhaustive) * ms, 3),
        "search_speedup": round(statistics.median(exhaustive) / statistics.median(pruned), 2),
        "purchase_us_p50": round(statistics.median(purchases) * us, 1),
        "purchase_us_p99": round(percentile(purchases, 0.99) * us, 1),
        "open_s": round(open_s, 3),
        "rss_mb": round(_rss_mb(), 1),
        "iterations": iterations,
    }


DEFAULT_BENCH_SEED = 0


def default_cache_dir() -> Path:
    """Where ``bench --products`` keeps its generated catalogs: $WEBSHOP_BENCH_CACHE or ~/.cache/webshop-env."""
    configured = os.environ.get("WEBSHOP_BENCH_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "webshop-env" / "bench"


def ensure_generated_catalog(
    cache_dir: Path, products: int, seed: int = DEFAULT_BENCH_SEED, progress: bool = False
) -> tuple[Path, dict[str, Any]]:
    """A prepared catalog of ``products`` generated products under ``cache_dir``, built only when missing.

    Returns its directory and what building it took (``generate_s``, ``prepare_s``, ``prepare_peak_rss_mb``;
    from the cache, as recorded when it was built). Both steps write atomically, so an interrupted run is
    redone rather than reused.
    """
    from .envs.webshop.catalog.generate import generate_catalog
    from .envs.webshop.catalog.store import MANIFEST

    root = Path(cache_dir) / f"generated-{products}-seed{seed}"
    raw, catalog, record = root / "raw", root / "catalog", root / "build.json"
    if (catalog / MANIFEST).exists() and record.exists():
        return catalog, json.loads(record.read_text(encoding="utf-8"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    generate_catalog(raw, products, seed=seed, progress=progress)
    generate_s = time.perf_counter() - started
    # prepare in a child process: its peak resident memory is then its own (wait4's rusage of that child)
    started = time.perf_counter()
    command = [sys.executable, "-m", "agent_envs.cli", "catalog", "prepare", "--raw", str(raw)]
    child = subprocess.Popen(  # its manifest goes to stderr: stdout is for this command's figures
        [*command, "--out", str(catalog), *([] if progress else ["--quiet"])], stdout=sys.stderr
    )
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"catalog prepare failed with exit status {child.returncode}")
    built = {
        "generate_s": round(generate_s, 1),
        "prepare_s": round(time.perf_counter() - started, 1),
        "prepare_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }
    record.write_text(json.dumps(built) + "\n", encoding="utf-8")
    return catalog, built


def bench_generated(
    sizes: list[int],
    cache_dir: Path,
    iterations: int = 2000,
    seed: int = DEFAULT_BENCH_SEED,
    progress: bool = False,
) -> dict[str, Any]:
    """``bench_in_process`` on generated catalogs of each size, each in a fresh process (clean memory figures)."""
    runs = []
    for products in sizes:
        catalog, built = ensure_generated_catalog(cache_dir, products, seed=seed, progress=progress)
        command = [sys.executable, "-m", "agent_envs.cli", "bench", "--catalog", str(catalog)]
        done = subprocess.run(
            [*command, "--iterations", str(iterations), "--json"], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"bench of {catalog} failed:\n{done.stderr[-3000:]}")
        runs.append({**json.loads(done.stdout), **built, "catalog": str(catalog)})
    return {"runs": runs, "cache_dir": str(cache_dir), "seed": seed, "load_avg": list(os.getloadavg())}


TABLE_COLUMNS = (
    ("products", "products"),
    ("click_us_p50", "click p50 (µs)"),
    ("click_us_p99", "click p99 (µs)"),
    ("search_ms_p50", "search p50 (ms)"),
    ("search_ms_p99", "search p99 (ms)"),
    ("search_speedup", "pruning speed-up"),
    ("purchase_us_p50", "purchase p50 (µs)"),
    ("open_s", "open (s)"),
    ("rss_mb", "RSS (MB)"),
    ("prepare_s", "prepare (s)"),
    ("prepare_peak_rss_mb", "prepare peak RSS (MB)"),
)


def markdown_table(runs: list[dict[str, Any]]) -> str:
    """The README's in-process table for these runs."""
    lines = [
        "| " + " | ".join(title for _, title in TABLE_COLUMNS) + " |",
        "|" + " --- |" * len(TABLE_COLUMNS),
    ]
    for run in runs:
        lines.append("| " + " | ".join(f"{run.get(key, '')}" for key, _ in TABLE_COLUMNS) + " |")
    return "\n".join(lines)
