"""OpenEnv's own client (``openenv`` 0.10 from PyPI, unmodified, in .venv-trl) plays through the Ray Serve app, not
only through nginx: ``make up-ray``'s one-node Ray head (``agent_envs.ray_serve.local``, as
tests/integration/test_ray_serve_local.py starts it) serving TextCraft and BabyAI in 2 replicas, and the client
pointed at Serve's proxy (``http://127.0.0.1:<port>/<env>/openenv``).

One WebSocket session per environment plays the expert's episode to its end, step for step what the environment's
core gives in process (the last step done, with a reward), then ``state``; the HTTP routes answer in OpenEnv's own
models' shapes, and a stateless HTTP step continues from the reset's observation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from _openenv import SECRET, OpenEnvDriver, core_trace, openenv_trace, play

from agent_envs import cluster
from agent_envs.api.settings import Settings
from agent_envs.envs import registry
from agent_envs.ray_serve import local

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ENVS = ("textcraft", "babyai")
TASK = 3
MAX_ACTIONS = 40


@pytest.fixture(scope="module")
def serve_url(generated_catalog_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Serve proxy's address of a local Ray head serving ENVS (2 replicas), stopped after the module."""
    run_dir = tmp_path_factory.mktemp("openenv-ray") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENTRL_STATE_SECRET", SECRET)
        try:
            record = local.up(run_dir, generated_catalog_dir, cluster.free_ports(1)[0], replicas_per_node=2,
                              cpus=2, extra=["--envs", ",".join(ENVS)])  # fmt: skip
            (node,) = record["env"]["nodes"]
            assert node["replicas"] == 2 and node["readyz"] == 200 and node["proxy"] == "HEALTHY"
            yield record["env"]["local_url"]
        finally:
            local.down(run_dir)


@pytest.fixture(scope="module")
def cores(generated_catalog_dir: Path) -> Iterator[dict[str, Any]]:
    envs = ",".join(ENVS)
    settings = Settings(catalog=generated_catalog_dir, envs=envs, state_secret=SECRET, access_log=False)
    yield {env_id: registry.make(env_id, settings) for env_id in ENVS}


@pytest.mark.parametrize("env_id", ENVS)
def test_openenv_client_plays_an_episode_through_serves_proxy(
    serve_url: str, driver: OpenEnvDriver, cores: dict[str, Any], env_id: str
) -> None:
    core = cores[env_id]
    actions = list(core.expert(TASK))[:MAX_ACTIONS]
    expected = core_trace(core, TASK, actions)
    assert expected[-1][2] and expected[-1][1] > 0, "the expert's episode ends with a reward"

    base = f"{serve_url}/{env_id}/openenv"
    # OpenEnv's client opens a WebSocket to .../openenv/ws, held by one replica for the session
    assert driver.call("open", client=env_id, base_url=base) == "GenericEnvClient"
    answers = play(driver, env_id, TASK, actions)
    assert openenv_trace(answers) == expected
    assert answers[-1]["done"] and answers[-1]["reward"] == expected[-1][1] > 0
    assert answers[-1]["metadata"]["task"] == TASK
    state = driver.call("state", client=env_id)
    assert (state["step_count"], state["task"], state["done"], state["env"], state["session"]) == (
        len(answers) - 1, TASK, True, env_id, None
    )  # fmt: skip
    driver.call("close", client=env_id)

    # the HTTP routes through the same proxy, in OpenEnv's own models' shapes
    first = requests.post(f"{base}/reset", json={"task": TASK}, timeout=60).json()
    driver.call("validate", model="ResetResponse", value=first)
    body = {"action": {"action": actions[0], "state": first["observation"]["state"]}}
    second = requests.post(f"{base}/step", json=body, timeout=60).json()
    driver.call("validate", model="StepResponse", value=second)
    assert openenv_trace([first, second]) == expected[:2]
    for route, model in (("state", "State"), ("metadata", "EnvironmentMetadata"), ("schema", "SchemaResponse"),
                         ("health", "HealthResponse")):  # fmt: skip
        driver.call("validate", model=model, value=requests.get(f"{base}/{route}", timeout=30).json())
