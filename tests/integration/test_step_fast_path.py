"""`POST /v1/step`'s fast path (agent_envs.envs.webshop.http.native.StepFastPath) answers exactly as the FastAPI route
does: same status, headers and body bytes for every step it serves, and every request it declines or every step
that fails reaches the route, which answers it (errors included) as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from _support import SECRET
from fastapi.testclient import TestClient

from agent_envs.api import routes_native
from agent_envs.api.app import create_app
from agent_envs.api.settings import Settings


@pytest.fixture(scope="module")
def api(conformance_catalog_dir: Path) -> Iterator[TestClient]:
    settings = Settings(catalog=conformance_catalog_dir, state_secret=SECRET, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per step request the fast path saw: True when it answered, False when the route did."""
    seen: list[bool] = []
    answer = routes_native.StepFastPath._answer

    def recording(scope, body):
        result = answer(scope, body)
        seen.append(result is not None)
        return result

    monkeypatch.setattr(routes_native.StepFastPath, "_answer", staticmethod(recording))
    return seen


# A JSON content type that FastAPI parses as JSON (``+json``) and the fast path leaves to the route. (A body with
# no content type at all is not JSON to FastAPI >= 0.133, its CSRF guard: the route answers it 422.)
ROUTE_ONLY = "application/webshop+json"


def _step(api: TestClient, body: bytes, content_type: str | None = "application/json"):
    headers = {"content-type": content_type} if content_type else {}
    return api.post("/v1/step", content=body, headers=headers)


def test_the_fast_path_answers_byte_for_byte_as_the_route(
    api: TestClient, served: list[bool], expert_plans: dict[int, list[str]]
) -> None:
    """Whole expert episodes, each step sent twice: through the fast path (JSON content type) and through the
    route (a ``+json`` content type, which FastAPI parses as JSON too and the fast path leaves to it)."""

    def both(state: str, action: str) -> dict:
        body = orjson.dumps({"state": state, "action": action})
        fast, route = _step(api, body), _step(api, body, content_type=ROUTE_ONLY)
        assert (fast.status_code, fast.content) == (route.status_code, route.content), action
        assert fast.headers["content-type"] == route.headers["content-type"] == "application/json"
        assert fast.headers["content-length"] == route.headers["content-length"]
        return fast.json()

    for goal, actions in list(expert_plans.items())[:8]:
        state = api.post("/v1/reset", json={"goal": goal}).json()["state"]
        # an invalid action and a non-ASCII query are steps too (200, valid false / a results page)
        assert both(state, "click[not a button]")["info"]["valid"] is False
        assert both(state, "search[" + "é" * 30 + " shoes]")["info"]["valid"] is True
        for action in actions:
            state = both(state, action)["state"]
    assert served and all(served[0::2]) and not any(served[1::2])


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        (b'{"state": "v1.x.y", "action": "click[x]"}', 400, "invalid_token"),
        (b'{"state": 3, "action": "click[x]"}', 422, None),
        (b'{"action": "click[x]"}', 422, None),
        (b'["state", "action"]', 422, None),
        (b'{"state": "v1.x.y", "action": "', 400, "malformed_json"),
        (b'{"state": "v1.x.y", "action": "' + b"a" * 2049 + b'"}', 422, None),
        (b'{"state": "v1.x.y", "action": "\\ud800"}', 422, None),
    ],
)
def test_what_the_fast_path_declines_gets_the_routes_error(
    api: TestClient, served: list[bool], body: bytes, status: int, kind: str | None
) -> None:
    answer = _step(api, body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert set(error) == {"error", "detail"} and (kind is None or error["error"] == kind), error
    assert served == [False]


def test_a_finished_episode_is_refused_by_the_route(
    api: TestClient, served: list[bool], expert_plans: dict[int, list[str]]
) -> None:
    goal, actions = next(iter(expert_plans.items()))
    page = api.post("/v1/reset", json={"goal": goal}).json()
    for action in actions:
        page = _step(api, orjson.dumps({"state": page["state"], "action": action})).json()
    assert page["done"] is True
    again = _step(api, orjson.dumps({"state": page["state"], "action": "click[buy now]"}))
    assert again.status_code == 409 and again.json()["error"] == "episode_finished"
    assert served[-1] is False and all(served[:-1])


def test_steps_served_by_the_fast_path_are_counted_under_the_routes_template(api: TestClient) -> None:
    def count() -> float:
        text = api.get("/metrics").text
        lines = [line for line in text.splitlines() if line.startswith("agentrl_http_requests_total{")
                 and 'route="/v1/step"' in line and 'status="200"' in line]  # fmt: skip
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    before = count()
    state = api.post("/v1/reset", json={"goal": 1}).json()["state"]
    assert _step(api, orjson.dumps({"state": state, "action": "search[red]"})).status_code == 200
    assert count() == before + 1


def test_deep_nesting_is_left_to_the_route(api: TestClient, served: list[bool]) -> None:
    """orjson parses nesting that Python's parser (the route's) refuses: such bodies are the route's to answer."""
    state = api.post("/v1/reset", json={"goal": 2}).json()["state"]
    for depth in (10, 1000):
        body = b'{"state": "%s", "action": "search[red]", "z": %s%s}' % (
            state.encode(),
            b"[" * depth,
            b"]" * depth,
        )
        fast, route = _step(api, body), _step(api, body, content_type=ROUTE_ONLY)
        assert (fast.status_code, fast.content) == (route.status_code, route.content), depth
    assert served == [
        True,
        False,
        False,
        False,
    ]  # depth 10: fast, then the route; depth 1000: the route twice


def test_a_client_that_goes_away_mid_body_is_counted_as_the_route_counts_it(api: TestClient) -> None:
    """A disconnect before the body is complete reaches the route (400, under its template), not a bare 500."""
    import asyncio

    def count(status: str) -> float:
        lines = [line for line in api.get("/metrics").text.splitlines()
                 if line.startswith("agentrl_http_requests_total{") and 'route="/v1/step"' in line
                 and f'status="{status}"' in line]  # fmt: skip
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    async def go_away() -> list[dict]:
        messages = [
            {"type": "http.request", "body": b'{"state": "v2.', "more_body": True},
            {"type": "http.disconnect"},
        ]
        sent: list[dict] = []

        async def receive() -> dict:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/step", "raw_path": b"/v1/step", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("testserver", 80),
                 "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                             (b"content-length", b"300")]}  # fmt: skip
        await api.app(scope, receive, send)
        return sent

    before = count("400")
    sent = asyncio.run(go_away())
    assert sent[0]["status"] == 400
    assert count("400") == before + 1


def test_bodies_without_a_length_or_over_the_limit_are_the_stacks(
    api: TestClient, served: list[bool], expert_plans: dict[int, list[str]]
) -> None:
    """The fast path reads only Content-Length bodies within the limit: a chunked step is still answered (by
    the route), an oversized one gets the body limit's 413, and neither reaches the fast path's parser."""
    state = api.post("/v1/reset", json={"goal": 3}).json()["state"]
    body = orjson.dumps({"state": state, "action": "search[red shoes]"})
    fast = _step(api, body)
    chunked = api.post(
        "/v1/step", content=iter([body[:10], body[10:]]), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 200 and chunked.content == fast.content
    big = orjson.dumps({"state": state, "action": "search[red]", "pad": "x" * 70_000})
    too_large = _step(api, big)
    assert too_large.status_code == 413 and too_large.json()["error"] == "body_too_large"
    assert served == [True]  # only the first request was the fast path's to parse


def test_a_body_without_content_type_is_refused_not_guessed(api: TestClient) -> None:
    """FastAPI's strict content type (a browser's cross-site form post carries none): 422, the JSON error shape."""
    state = api.post("/v1/reset", json={"goal": 2}).json()["state"]
    answer = _step(api, orjson.dumps({"state": state, "action": "search[red]"}), content_type=None)
    assert answer.status_code == 422 and set(answer.json()) == {"error", "detail"}
