"""The AgentGym routes' fast path (``agent_envs.api.routes_envs.CompatFastPath``) answers exactly as their FastAPI
routes do: two apps get the same requests, one with the fast path and one without, and every answer is the same
(status, headers, body; the session id, drawn at random by each app, aside). What the fast path declines (a body
the model refuses, not JSON) reaches the route, which answers it as before; an error raised
while answering (the session store down) is answered as the app's exception handlers answer it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _support import SECRET
from fastapi.testclient import TestClient

from agent_envs.api import routes_envs
from agent_envs.api.app import create_app
from agent_envs.api.settings import Settings
from agent_envs.envs.agentgym import remap_id


def _app(fast: bool, **settings: Any) -> TestClient:
    app = create_app(Settings(envs="textcraft,babyai", state_secret=SECRET, access_log=False, **settings))
    if not fast:
        app.fast_paths = {}  # every route answered by the framework
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def apps() -> Iterator[tuple[TestClient, TestClient]]:
    with _app(True) as fast, _app(False) as route:
        yield fast, route


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per request the fast path looked at: True when it took it, False when it left it to the route."""
    seen: list[bool] = []
    fields = routes_envs.CompatFastPath._fields

    def recording(scope, model, body):
        result = fields(scope, model, body)
        seen.append(result is not None)
        return result

    monkeypatch.setattr(routes_envs.CompatFastPath, "_fields", staticmethod(recording))
    return seen


def both(apps: tuple[TestClient, TestClient], path: str, ids: tuple[int, int] | None = None, **request: Any):
    """The request to both apps (``ids``: each app's session id, put into the JSON body); asserts they answered
    alike; returns the fast app's answer."""
    fast, route = apps
    answers = []
    for client, env_idx in zip(apps, ids or (None, None), strict=True):
        kwargs = dict(request)
        if env_idx is not None:
            kwargs["json"] = {**kwargs["json"], "id": env_idx}
        answers.append(client.post(path, **kwargs))
    a, b = answers
    assert a.status_code == b.status_code, (path, a.text, b.text)
    for header in ("content-type", "retry-after"):
        assert a.headers.get(header) == b.headers.get(header), (header, a.headers, b.headers)
    assert int(a.headers["content-length"]) == len(a.content)
    if ids is None:
        assert a.content == b.content
    else:  # each app's own random session id (its digits make the lengths differ)
        assert remap_id(a.json(), ids[0], ids[1]) == b.json(), (a.text, b.text)
    return a


def test_episodes_are_answered_alike(apps, served) -> None:
    for env_id, task, actions in (
        (
            "textcraft",
            7,
            ["inventory", "get 1 blackstone", "craft 1 blackstone stairs using 6 blackstone", "x"],
        ),
        ("babyai", 41, ["turn left", "move forward", "go to red ball 1", "not an action", "turn right"]),
    ):
        base = f"/{env_id}"
        body = {"commands": None, "goal": None} if env_id == "textcraft" else None
        created = [client.post(base + "/create", json=body) for client in apps]
        assert [c.status_code for c in created] == [200, 200]
        ids = (created[0].json()["id"], created[1].json()["id"])
        both(apps, base + "/reset", ids, json={"data_idx": task})
        for action in actions:
            both(apps, base + "/step", ids, json={"action": action})
        both(apps, base + "/reset", ids, json={"data_idx": 10**30})  # out of range: AgentGym's error shape
        both(apps, base + "/close", ids, json={})
        both(apps, base + "/close", ids, json={})  # closed already: false
        both(apps, base + "/step", ids, json={"action": "inventory"})  # "The id N is not valid."
    assert served and all(served)


@pytest.mark.parametrize(
    ("path", "content", "headers"),
    [
        ("/textcraft/step", b'{"id": 1, "action": 3}', {"content-type": "application/json"}),  # model refuses
        ("/textcraft/step", b'{"id": 1}', {"content-type": "application/json"}),  # a field missing
        (
            "/textcraft/step",
            b'{"id": 1, "action": "' + b"x" * 2049 + b'"}',
            {"content-type": "application/json"},
        ),
        ("/babyai/reset", b'{"id": true, "data_idx": 1}', {"content-type": "application/json"}),
        ("/babyai/reset", b"[1, 2]", {"content-type": "application/json"}),  # JSON, not an object
        ("/babyai/step", b"{not json", {"content-type": "application/json"}),
        ("/babyai/step", b'{"id": 1, "action": "x"}', {"content-type": "text/plain"}),
        (
            "/textcraft/reset",
            b'{"id": 1, "data_idx": ' + b"[" * 100 + b"]" * 100 + b"}",
            {"content-type": "application/json"},
        ),
        (
            "/babyai/step",
            b'{"id": 1, "action": "\\ud800"}',
            {"content-type": "application/json"},
        ),  # lone surrogate
    ],  # fmt: skip
)
def test_what_the_fast_path_declines_the_route_answers(apps, served, path, content, headers) -> None:
    answer = both(apps, path, content=content, headers=headers)
    assert 400 <= answer.status_code < 500 and answer.json()["error"] in (
        "validation_error",
        "malformed_json",
    )
    assert served and not any(served)


def test_an_error_while_answering_is_answered_as_the_handlers_do(served) -> None:
    """No session store (nothing listens on its port): both say 503 session_store_down, with Retry-After."""
    down = {"redis_url": "redis://127.0.0.1:1/0"}
    with _app(True, **down) as fast, _app(False, **down) as route:
        answer = both((fast, route), "/babyai/step", json={"id": 5, "action": "turn left"})
        assert (answer.status_code, answer.json()["error"]) == (503, "session_store_down")
        assert answer.headers["retry-after"] == "1"
        metrics = fast.get("/metrics").text
    assert 'agentrl_errors_total{kind="session_store_down"} 1.0' in metrics
    assert 'agentrl_http_requests_total{method="POST",route="/babyai/step",status="503"} 1.0' in metrics
    assert served == [True]
