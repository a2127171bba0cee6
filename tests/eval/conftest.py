"""Eval fixtures: a real cluster (2 replicas + nginx) on the bundled-generator catalog, runs shared by the
tests, a scripted OpenAI-compatible chat server, and headless Chromium.

nginx must be installed (``make nginx``); Chromium (Debian ``chromium``) for the report tests, which are
skipped with the install command when it is missing.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
if importlib.util.find_spec("agent_trainer") is None:  # not installed: use the checkout
    sys.path.insert(0, str(HERE.parents[1] / "services" / "trainer" / "src"))

from _eval_support import SAMPLES, SECRET, ScriptedChatServer  # noqa: E402

from agent_envs import cluster as local_cluster  # noqa: E402


@pytest.fixture(scope="session")
def eval_cluster(
    generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """2 replicas + nginx on free ports serving the generated catalog; the ``local_cluster.up`` record."""
    cluster = local_cluster
    run_dir = tmp_path_factory.mktemp("eval-cluster")
    record = cluster.up(
        replicas=2,
        catalog=generated_catalog_dir,
        base_port=0,
        port=0,
        workers=1,
        run_dir=run_dir,
        env={"AGENTRL_STATE_SECRET": SECRET},
        timeout=60,
        quiet=True,
    )
    try:
        yield record
    finally:
        cluster.down(run_dir, quiet=True)


@pytest.fixture(scope="session")
def plans_by_instruction(generated_catalog) -> dict[str, list[str]]:
    """Expert actions of the first test goals, keyed by instruction text (what the chat server sees)."""
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions

    env = WebShopEnv(generated_catalog)
    return {
        env.goal("synthetic", goal).instruction_text: expert_actions(env, goal, "synthetic")
        for goal in range(SAMPLES)
    }


@pytest.fixture(scope="session")
def chat_server(plans_by_instruction: dict[str, list[str]]) -> Iterator[ScriptedChatServer]:
    server = ScriptedChatServer(plans_by_instruction)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def chat(chat_server: ScriptedChatServer) -> ScriptedChatServer:
    """The session's chat server with its script and request log cleared."""
    chat_server.reset()
    return chat_server


def _run(cluster: dict[str, Any], out: Path, policy: str, **options: Any) -> Any:
    from agent_trainer.evaluation.runner import EvalConfig, PolicySpec, evaluate

    config = EvalConfig(
        out=out,
        url=cluster["url"],
        split="test",
        goal_set="synthetic",
        max_samples=SAMPLES,
        concurrency=16,
        progress=False,
        **options,
    )
    return evaluate(config, PolicySpec(name=policy, seed=0))


@pytest.fixture(scope="session")
def expert_run(eval_cluster: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The expert on the test split, plans from the server's expert endpoint (EvalResult)."""
    return _run(eval_cluster, tmp_path_factory.mktemp("expert"), "expert")


@pytest.fixture(scope="session")
def random_run(
    eval_cluster: dict[str, Any], generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """The random policy on the test split, categories from the local catalog (EvalResult)."""
    return _run(eval_cluster, tmp_path_factory.mktemp("random"), "random", catalog=generated_catalog_dir)


@pytest.fixture(scope="session")
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("headless Chromium is not installed: apt-get install -y chromium")
