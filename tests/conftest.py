"""Shared fixtures (catalogs prepared once per test session), and which command runs which test.

`make test` (a contributor's check before a change, at most 10 minutes on 2 cores) runs every test that is not
marked ``slow``; `make test-all` (CI) runs them all but those marked ``extended`` (EXTENDED below), which `make
test-extended` runs by hand. A test is ``slow`` where its file says so, or where SLOW
below lists it (a folder, a file or one test, by the start of its node id); ALSO_IN_MAKE_TEST puts a test marked
``slow`` in its own file back into `make test` (marker ``make_test``). The markers are registered in
pyproject.toml; `--durations=25` in both commands keeps the budget visible.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/_agentgym.py

# The tests reach no model hub (nor does CI's machine): a hub id's files are found in the local cache or not at all,
# at once, instead of after huggingface_hub's retries (~45 s a load: the launcher's dry runs, which measure first
# turns with the config's tokenizer, spent 4 minutes of make test on them). A test's subprocesses inherit it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FIXTURES = Path(__file__).parent / "fixtures"
CONFORMANCE = FIXTURES / "conformance" / "original-seed3"

# What `make test` leaves to `make test-all`, with why (seconds: one run on the shared, loaded 2-core machine).
SLOW: dict[str, str] = {
    "tests/multinode/": "3-node Ray clusters and a real Slurm in network namespaces (minutes, root)",
    "tests/docker/": "the Docker stack for real (make test-docker, 6-10 minutes)",
    "tests/faults/": "replicas, hosts and session stores frozen, cut off or killed under load (about 3 minutes)",
    "tests/integration/test_ray_serve_local.py": "a Ray head serving the env as a Ray Serve app (130 s)",
    "tests/trainer/test_rehearsal_envs.py::test_the_warm_start_trains_on_until_its_rollouts_would_earn_a_reward": (
        "a warm start of the tiny model to its gate (300 supervised steps and more: 1-4 minutes)"
    ),
    "tests/integration/test_ray_serve_limits.py": "a Ray head serving the env; stalled requests wait out 2 s limits "
    "(100 s)",
    "tests/integration/test_ray_serve_attach.py": "four commands attach to dead Ray heads, with 10 s timeouts (110 s)",
    "tests/integration/test_benchmarks.py": "the benchmark commands on small catalogs and two clusters (40 s)",
    "tests/eval/test_eval_e2e.py": "eval end to end through a cluster",
    "tests/eval/test_demo.py": "make demo end to end",
    "tests/eval/test_report_chromium.py": "the report rendered in headless Chromium",
    "tests/eval/test_model_path.py": "verl's merger, and a tiny model served from its output (60-70 s each)",
    "tests/integration/test_envs_cluster.py::test_replica_killed_mid_run": "a replica SIGKILLed under 32 episodes of "
    "each environment (up to 7 minutes)",
    "tests/deploy/test_trainer_image.py": "imports every module of a GPU run (45 s)",
    "tests/envs/test_babyai.py::test_every_new_oracle_episode_replays": "all 4,000 episodes recorded from "
    "AgentGym's BabyAI server for issue 36, 156,275 steps (make test replays 77 of them)",
    "tests/trainer/test_train_launch.py::test_training_starts_as": "launches verl's main_ppo (40 s)",
    "tests/trainer/test_train_launch.py::test_a_finished_run_says_so": "launches agent-train train (20-160 s each)",
}
# Too long for CI's 60 minutes beside what it runs (make test-all), and covered there another way: `make
# test-extended` runs them by hand (marker ``extended``; docs/development.md says what each costs).
EXTENDED: dict[str, str] = {
    "tests/deploy/test_trainer_verl09_resolution.py": "pip's resolver over both CUDA trainer images' install sets "
    "against PyPI (8 minutes loaded); make test-docker's CPU build runs docker/trainer-lock.py and the install for real",
    "tests/integration/test_bench_envs.py::test_every_row_is_measured": "bench-envs over every row and environment "
    "(4 minutes loaded): a benchmark; its comparison beside AgentGym's servers stays in make test-all",
    # For CI's time (docs/development.md), each covered in make test-all another way:
    "tests/multinode/test_ray_serve_cluster.py": "a 3-node Ray cluster losing a node under Serve episodes (2-3 "
    "minutes); make test-all keeps the Serve app's local runs (tests/integration/test_ray_serve_*.py)",
    "tests/multinode/test_ray_head_loss.py": "attaching to a lost Ray head in network namespaces (about 2 minutes); "
    "make test-all keeps the local attach-failure tests (tests/integration/test_ray_serve_attach.py)",
    "tests/multinode/test_slurm_ray.py": "the sbatch starting Ray, the env and a training stand-in on a real two-node "
    "Slurm (about 1.5 minutes); make test-all keeps the Slurm job's refusals and env checks",
    "tests/trainer/test_rehearsal_bugs.py::test_make_rehearse_fails_on_a_stale_weight_sync": "a whole rehearsal "
    "with a planted bug (about 5 minutes); make test-all runs make rehearse, and the step checks' own bug tests",
    "tests/trainer/test_train_launch.py::test_a_finished_run_says_so_instead_of_training_nothing[8": "the resume "
    "cases of a finished run (1 minute each); make test-all keeps the first",
    "tests/trainer/test_train_launch.py::test_a_finished_run_says_so_instead_of_training_nothing[9": "as above",
    "tests/trainer/test_train_on_clusters.py::test_dataset_paths_mean_the_callers_directory": "launches verl on a "
    "local Ray cluster (about 2 minutes); make test-docker's compose jobs run the user's dataset paths",
}
# Marked slow in their own files, yet what every change to the API must pass (tests/faults/test_fuzz_envs.py, the
# other environments' routes, stays in make test-all: 2 more minutes).
ALSO_IN_MAKE_TEST: dict[str, str] = {
    "tests/faults/test_fuzz_all_checks.py": "the API fuzz suite: schemathesis, all checks, every route (3-4 minutes)",
}


def _listed(nodeid: str, table: dict[str, str]) -> bool:
    return any(nodeid.startswith(prefix) for prefix in table)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Apply SLOW, EXTENDED and ALSO_IN_MAKE_TEST (before `-m` selects)."""
    for item in items:  # node ids are relative to the repository (pyproject.toml's directory)
        if _listed(item.nodeid, EXTENDED):
            item.add_marker(pytest.mark.extended)
            item.add_marker(pytest.mark.slow)
        elif _listed(item.nodeid, ALSO_IN_MAKE_TEST):
            item.add_marker(pytest.mark.make_test)
        elif _listed(item.nodeid, SLOW):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def conformance_catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conformance raw data prepared with the reference run's prices, ceilings and title nouns pinned."""
    from agent_envs.envs.webshop.catalog.prepare import Pins, prepare_catalog

    out = tmp_path_factory.mktemp("conformance") / "catalog"
    pins = Pins.from_files(
        prices=CONFORMANCE / "synthetic-goals" / "product_prices.json",
        title_nouns=CONFORMANCE / "synthetic-goals" / "title_nouns.json",
        goals={
            "synthetic": CONFORMANCE / "synthetic-goals" / "goals.json",
            "human": CONFORMANCE / "human-goals" / "goals.json",
        },
    )
    prepare_catalog(CONFORMANCE / "raw", out, num_products=1000, pins=pins, progress=False)
    return out


@pytest.fixture(scope="session")
def conformance_catalog(conformance_catalog_dir: Path):
    from agent_envs.envs.webshop.catalog.store import open_catalog

    return open_catalog(conformance_catalog_dir)


@pytest.fixture(scope="session")
def generated_catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small bundled-generator catalog, prepared the way `make data` prepares the default one."""
    from agent_envs.envs.webshop.catalog.generate import generate_catalog
    from agent_envs.envs.webshop.catalog.prepare import prepare_catalog

    root = tmp_path_factory.mktemp("generated")
    generate_catalog(root / "raw", products=600, seed=7, progress=False)
    prepare_catalog(root / "raw", root / "catalog", progress=False)
    return root / "catalog"


@pytest.fixture(scope="session")
def generated_catalog(generated_catalog_dir: Path):
    from agent_envs.envs.webshop.catalog.store import open_catalog

    return open_catalog(generated_catalog_dir)
