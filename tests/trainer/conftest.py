"""Trainer-side fixtures: the env API in-process (ASGI, no sockets) behind the interaction's shared client."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SECRET = "trainer-tests-secret-0123456789abcdef-0123456789"
HAVE_VERL = importlib.util.find_spec("verl") is not None
NEEDS_VERL = "the trainer package needs verl: .venv/bin/pip install -c constraints.txt -e services/trainer"


@pytest.fixture
def env_app(generated_catalog_dir: Path) -> Any:
    """The env service app with its runtime opened (ASGITransport does not run the lifespan)."""
    from agent_envs.api.app import create_app, open_runtimes
    from agent_envs.api.settings import Settings

    app = create_app(Settings(catalog=generated_catalog_dir, state_secret=SECRET, access_log=False))
    open_runtimes(app)
    return app


@pytest.fixture
def in_process_env(monkeypatch: pytest.MonkeyPatch, env_app: Any) -> Iterator[Any]:
    """Route every WebshopInteraction client to ``env_app`` in-process; a clean episode registry."""
    if not HAVE_VERL:
        pytest.skip(NEEDS_VERL)
    import httpx

    from agent_envs.client import native
    from agent_trainer import interaction

    class InProcessClient(native.WebShopClient):
        def __init__(self, base_url: str, **kwargs: Any) -> None:
            super().__init__(base_url, transport=httpx.ASGITransport(app=env_app), **kwargs)

    monkeypatch.setattr(
        native, "WebShopClient", InProcessClient
    )  # the one WebShop's spec opens (envs.webshop.client)
    interaction.EPISODES.clear()
    yield env_app
    interaction.EPISODES.clear()


def babyai_served() -> bool:
    """Whether BabyAI can be served here (minigrid installed)."""
    try:
        from agent_envs.envs import registry

        registry.make("babyai")
    except Exception:  # not installed (minigrid) or not there yet
        return False
    return True


def served_app(catalog_dir: Path, envs: str) -> Any:
    """The env service app serving ``envs`` (comma-separated) with its runtimes opened (ASGITransport does not run
    the lifespan): the real app, routes and signed tokens."""
    from agent_envs.api.app import create_app, open_runtimes
    from agent_envs.api.settings import Settings

    app = create_app(Settings(catalog=catalog_dir, state_secret=SECRET, access_log=False, envs=envs))
    open_runtimes(app)
    return app


@pytest.fixture
def env_clients_in_process(monkeypatch: pytest.MonkeyPatch, generated_catalog_dir: Path) -> Any:
    """``serve(envs)``: every ``agent_envs.client.envs.EnvClient`` made afterwards talks to an in-process app
    serving ``envs`` (whatever URL it is given); returns the app."""
    import httpx

    from agent_envs.client import envs as client_envs

    def serve(envs: str) -> Any:
        app = served_app(generated_catalog_dir, envs)
        transport = httpx.ASGITransport(app=app)

        class InProcessEnv(client_envs.EnvClient):
            def __init__(self, base_url: str, env_id: str, **kwargs: Any) -> None:
                super().__init__(base_url, env_id, transport=transport, **kwargs)

        monkeypatch.setattr(client_envs, "EnvClient", InProcessEnv)
        return app

    return serve


@pytest.fixture
def env_service(monkeypatch: pytest.MonkeyPatch, generated_catalog_dir: Path) -> Iterator[Any]:
    """WebShop, TextCraft (and BabyAI where it can be served) in one app, every client of the trainer (the
    interactions' and the agent loops') routed to it in-process: the real app, routes, signed tokens and clients."""
    if not HAVE_VERL:
        pytest.skip(NEEDS_VERL)
    import httpx

    from agent_envs.client import envs as client_envs
    from agent_envs.client import native
    from agent_trainer import interaction

    served = ["webshop", "textcraft", *(["babyai"] if babyai_served() else [])]
    app = served_app(generated_catalog_dir, ",".join(served))
    transport = httpx.ASGITransport(app=app)

    class InProcessWebShop(native.WebShopClient):
        def __init__(self, base_url: str, **kwargs: Any) -> None:
            super().__init__(base_url, transport=transport, **kwargs)

    class InProcessEnv(client_envs.EnvClient):
        def __init__(self, base_url: str, env_id: str, **kwargs: Any) -> None:
            super().__init__(base_url, env_id, transport=transport, **kwargs)

    # the classes the specs' clients open (EnvSpec.client looks them up when called)
    monkeypatch.setattr(native, "WebShopClient", InProcessWebShop)
    monkeypatch.setattr(client_envs, "EnvClient", InProcessEnv)
    interaction.EPISODES.clear()
    yield app
    interaction.EPISODES.clear()


@pytest.fixture(scope="session")
def expert_plans_generated(generated_catalog) -> dict[int, list[str]]:
    """Train-split synthetic goals of the generated catalog whose expert plan reaches reward 1.0."""
    from agent_envs.envs.webshop.core.env import WebShopEnv
    from agent_envs.envs.webshop.core.oracle import expert_actions, run_actions

    env = WebShopEnv(generated_catalog)
    plans: dict[int, list[str]] = {}
    for goal in range(1500, 1700):
        actions = expert_actions(env, goal, "synthetic")
        if actions and run_actions(env, goal, actions, "synthetic")[-1].reward == 1.0:
            plans[goal] = actions
        if len(plans) >= 5:
            break
    assert plans, "no goal of the generated catalog is solvable by the expert"
    return plans
