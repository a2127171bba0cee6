"""The benchmark commands run end to end and print what scripts rely on (figures are not asserted: they
depend on the machine). ``bench-http --calibrate`` starts real replicas and a real nginx twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_envs.bench import bench_generated, ensure_generated_catalog, markdown_table
from agent_envs.calibrate import step_requests

SIDE_KEYS = {"steps_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_step", "errors"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_bench_products_builds_once_and_reports_each_size(tmp_path: Path) -> None:
    catalog, built = ensure_generated_catalog(tmp_path, 1000)
    assert (catalog / "manifest.json").exists() and built["prepare_peak_rss_mb"] > 0
    manifest = (catalog / "manifest.json").read_bytes()
    again, built_again = ensure_generated_catalog(tmp_path, 1000)  # cached: not rebuilt
    assert again == catalog and built_again == built and (catalog / "manifest.json").read_bytes() == manifest
    result = bench_generated([1000], tmp_path, iterations=40)
    (run,) = result["runs"]
    assert run["products"] > 900 and run["catalog"] == str(catalog)
    for key in ("click_us_p50", "search_ms_p50", "search_ms_p99", "open_s", "rss_mb", "prepare_s"):
        assert run[key] > 0, key
    table = markdown_table(result["runs"]).splitlines()
    assert len(table) == 3 and table[2].startswith(f"| {run['products']} |")


def test_bench_products_rejects_bad_sizes(tmp_path: Path) -> None:
    for sizes in ("abc", "10", ""):
        done = cli("bench", "--products", sizes, "--cache-dir", str(tmp_path))
        assert done.returncode == 2 and "--products" in done.stderr
    done = cli("bench", "--products", "1000", "--catalog", str(tmp_path))
    assert done.returncode == 2 and "not both" in done.stderr


def test_calibrated_bench_http_prints_both_sides_and_ratios(generated_catalog_dir: Path) -> None:
    done = cli(
        "bench-http", "--calibrate", "--kind", "search-varied", "--catalog", str(generated_catalog_dir),
        "--replicas", "1", "--connections", "4", "--seconds", "0.5", "--rounds", "1", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    for side in ("calibration", "service"):
        assert set(result[side]) >= SIDE_KEYS, side
        assert result[side]["errors"] == 0 and result[side]["steps"] > 0
        assert result[side]["server_cpu_us_per_step"] > 0
    assert result["ratio"] > 0 and result["cpu_ratio"] > 0
    assert result["kind"] == "search-varied"


def test_calibration_requests_are_valid_steps(generated_catalog_dir: Path) -> None:
    from agent_envs.envs.webshop.catalog.store import open_catalog
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.http import token_codec

    catalog = open_catalog(generated_catalog_dir)
    env, codec = WebShopEnv(catalog), token_codec(b"s" * 32, catalog.fingerprint)
    for kind in ("click", "search", "search-varied"):
        request = step_requests(generated_catalog_dir, "s" * 32, kind)
        bodies = [json.loads(request(i)) for i in range(30)]
        for body in bodies:
            step = env.step(codec.decode(body["state"]), body["action"])
            assert step.info["valid"], (kind, body["action"])
        actions = {body["action"] for body in bodies}
        assert len(actions) == (1 if kind == "search" else len(actions))
        if kind == "search-varied":
            assert len(actions) == 30  # never the same query twice: the search cache cannot answer
        if kind == "click":
            assert all(action.startswith("click[") for action in actions) and len(actions) > 5
