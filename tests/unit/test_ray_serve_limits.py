"""``agent_envs.ray_serve.limits``: the proxy middleware's answers, driven as an ASGI app (no Ray), and its
settings. The real proxy is exercised in ``tests/integration/test_ray_serve_limits.py``."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_envs.ray_serve.limits import LimitsMiddleware, ProxyLimits


@pytest.fixture(autouse=True)
def _keep_uvicorns_protocol(monkeypatch) -> None:
    """The middleware sets uvicorn's protocol for its (proxy) process: undo that for this test process."""
    import uvicorn.config

    monkeypatch.setitem(uvicorn.config.HTTP_PROTOCOLS, "auto", uvicorn.config.HTTP_PROTOCOLS["auto"])


def run(limits: ProxyLimits, headers: list[tuple[bytes, bytes]], messages: list[dict], stall: bool = False):
    """Drive the middleware with ``messages`` as the client's body; returns (status, body, what the app got)."""
    got: list[bytes] = []

    async def app(scope, receive, send) -> None:
        message = await receive()
        got.append(message["body"])
        assert message["more_body"] is False
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main():
        queue = list(messages)
        sent: list[dict] = []

        async def receive() -> dict:
            if queue:
                return queue.pop(0)
            if stall:
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "raw_path": b"/v1/step", "query_string": b"", "headers": headers}
        await LimitsMiddleware(app, limits)(scope, receive, send)
        return sent

    sent = asyncio.run(main())
    status = sent[0]["status"] if sent else None
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, body, got


def test_a_body_in_pieces_reaches_the_app_whole() -> None:
    pieces = [{"type": "http.request", "body": b"ab", "more_body": True},
              {"type": "http.request", "body": b"cd", "more_body": False}]  # fmt: skip
    status, body, got = run(ProxyLimits(), [(b"content-length", b"4")], pieces)
    assert (status, body, got) == (200, b"ok", [b"abcd"])


def test_limits_answer_json() -> None:
    limits = ProxyLimits(body_timeout_s=0.05, max_body_bytes=1024)
    over = [{"type": "http.request", "body": b"x" * 600, "more_body": True}] * 2
    cases = {
        "declared too large": run(limits, [(b"content-length", b"2048")], []),
        "counted too large": run(limits, [], over),
        "stalled body": run(
            limits,
            [(b"content-length", b"100")],
            [{"type": "http.request", "body": b"ab", "more_body": True}],
            stall=True,
        ),  # fmt: skip
        "bad length": run(limits, [(b"content-length", b"-1")], []),
        "large head": run(ProxyLimits(max_header_bytes=1024), [(b"x-big", b"a" * 2000)], []),
    }
    seen = {name: (status, json.loads(body)["error"], got) for name, (status, body, got) in cases.items()}
    assert seen == {
        "declared too large": (413, "body_too_large", []),
        "counted too large": (413, "body_too_large", []),
        "stalled body": (408, "request_timeout", []),
        "bad length": (400, "bad_request", []),
        "large head": (431, "header_too_large", []),
    }


def test_the_proxy_environment_round_trips() -> None:
    from agent_envs.ray_serve.limits import proxy_middlewares

    limits = ProxyLimits(header_timeout_s=2.5, max_body_bytes=2048)
    env = limits.proxy_env()
    assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == "agent_envs.ray_serve.limits:proxy_middlewares"
    assert ProxyLimits.from_env(env) == limits
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        (middleware,) = proxy_middlewares()
    assert middleware.cls is LimitsMiddleware and middleware.kwargs["limits"] == limits


def test_settings_from_the_environment_are_validated() -> None:
    limits = ProxyLimits.from_env({"AGENTRL_BODY_TIMEOUT_S": "3", "AGENTRL_PROXY_MAX_BODY_BYTES": "4096"})
    assert (limits.body_timeout_s, limits.max_body_bytes, limits.header_timeout_s) == (3.0, 4096, 10.0)
    for bad in ({"AGENTRL_BODY_TIMEOUT_S": "soon"}, {"AGENTRL_BODY_TIMEOUT_S": "0"},
                {"AGENTRL_MAX_HEADER_BYTES": "10"}, {"AGENTRL_BODY_TIMEOUT_S": "nan"}):  # fmt: skip
        with pytest.raises(ValueError):
            ProxyLimits.from_env(bad)
