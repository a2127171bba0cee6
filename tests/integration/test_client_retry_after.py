"""The clients honour a 503's ``Retry-After`` for a bounded time (issue 31): the service answers 503 with
``Retry-After`` when it means "retry shortly" (``session_store_down`` while the AgentGym session store
restarts, a replica at its connection limit), and a client that gives up on it, or hammers it sooner, fails a
run that a short wait would have saved. Waits are recorded, not slept: no assertion on wall-clock time."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import _agentgym
import pytest
from _agentgym import AgentGymClient

from agent_envs.client import ServiceUnavailable, WebShopClient, base


# ---- WebShopClient (and EnvClient, which is one) ----------------------------------------------------------------
async def _serve(
    answers: list[tuple[int, dict[str, str], bytes]],
) -> tuple[asyncio.AbstractServer, str, list]:
    """A raw HTTP/1.1 server answering request n with answers[n] (the last one repeats)."""
    seen: list[int] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                await reader.readexactly(length)
                status, headers, body = answers[min(len(seen), len(answers) - 1)]
                seen.append(status)
                extra = b"".join(f"{name}: {value}\r\n".encode() for name, value in headers.items())
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen


DOWN = b'{"error":"session_store_down","detail":"retry shortly"}'
OK = b'{"observation":"ok","state":"s"}'


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's sleeps between attempts, recorded instead of slept."""
    recorded: list[float] = []

    async def sleep(seconds: float) -> None:
        recorded.append(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(base, "asyncio", SimpleNamespace(sleep=sleep))  # the retry loop's asyncio only
    return recorded


def _run(answers, **client_args) -> tuple[object, list[int]]:
    async def main():
        server, url, seen = await _serve(answers)
        async with server, WebShopClient(url, backoff=0.01, max_backoff=0.05, **client_args) as client:
            try:
                return await client.reset(1), seen
            except ServiceUnavailable as error:
                return error, seen

    return asyncio.run(main())


def test_a_503_is_not_retried_sooner_than_its_retry_after(waits: list[float]) -> None:
    result, seen = _run([(503, {"Retry-After": "2"}, DOWN), (503, {"Retry-After": "1"}, DOWN), (200, {}, OK)])
    assert result == {"observation": "ok", "state": "s"} and seen == [503, 503, 200]
    assert waits == [2.0, 1.0]  # what the server asked for, not the 10-50 ms of the client's own backoff


def test_retry_after_is_capped_and_bounded_by_the_budget(waits: list[float]) -> None:
    result, seen = _run([(503, {"Retry-After": "3600"}, DOWN), (200, {}, OK)], max_retry_after=3.0)
    assert seen == [503, 200] and waits == [3.0]
    # a wait that would end past the retry budget: give up now, saying what the server answered
    result, seen = _run([(503, {"Retry-After": "5"}, DOWN), (200, {}, OK)], retry_budget=2.0)
    assert (
        isinstance(result, ServiceUnavailable)
        and "HTTP 503" in str(result)
        and "session_store_down" in str(result)
    )
    assert seen == [503]


def test_without_retry_after_or_on_other_5xx_the_backoff_is_the_clients(waits: list[float]) -> None:
    result, seen = _run([(503, {}, DOWN), (502, {"Retry-After": "1"}, DOWN), (200, {}, OK)])
    assert seen == [503, 502, 200] and all(wait <= 0.05 for wait in waits), waits


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("1", 1.0), (" 2.5 ", 2.5), ("0", 0.0), ("soon", None), ("-1", None), ("", None), (None, None)],
)
def test_retry_after_seconds_reads_delta_seconds(header: str | None, seconds: float | None) -> None:
    assert base.retry_after_seconds(header) == seconds


def test_retry_after_seconds_reads_an_http_date() -> None:
    now = 1_700_000_000.0
    assert base.retry_after_seconds(formatdate(now + 7, usegmt=True), now=now) == pytest.approx(7.0)
    assert base.retry_after_seconds(formatdate(now - 60, usegmt=True), now=now) == 0.0


# ---- the AgentGym client of the tests (tests/_agentgym.py) ------------------------------------------------------
class _AgentGymStub(BaseHTTPRequestHandler):
    """/create, then GET /observation answered from the server's script (status, Retry-After or None)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._answer(200, None, 7)

    def do_GET(self) -> None:
        script = self.server.script  # type: ignore[attr-defined]
        status, retry_after = script.pop(0) if len(script) > 1 else script[0]
        body = "WebShop [SEP] page" if status == 200 else {"error": "session_store_down", "detail": "retry"}
        self._answer(status, retry_after, body)

    def _answer(self, status: int, retry_after: str | None, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AgentGymStub)
    server.script = [(200, None)]  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's sleeps, recorded; its clock advances by them (and only by them)."""
    recorded: list[float] = []
    clock = [1000.0]

    def sleep(seconds: float) -> None:
        recorded.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(_agentgym, "time", SimpleNamespace(sleep=sleep, monotonic=lambda: clock[0]))
    return recorded


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_agentgym_client_waits_out_a_503_with_retry_after(stub, slept: list[float]) -> None:
    """The Docker test's idle session (issue 31): no retry budget, yet a 503 session_store_down with
    Retry-After right after the store came back is waited out, not raised."""
    client = AgentGymClient(_url(stub), timeout=10)
    stub.script = [(503, "1"), (503, "2"), (200, None)]
    assert client.observe() == "WebShop [SEP] page"
    assert client.retried == 2 and len(slept) == 2
    assert 1.0 <= slept[0] <= 1.2 and 2.0 <= slept[1] <= 2.4  # what it was asked, spread a little


def test_agentgym_client_gives_up_after_its_bound_and_keeps_agentgyms_503(stub, slept: list[float]) -> None:
    client = AgentGymClient(_url(stub), timeout=10, retry_after_budget_s=3.0)
    stub.script = [(503, "2")]  # never comes back: 2 s + 2 s would pass the 3 s bound
    with pytest.raises(AssertionError, match="503"):
        client.observe()
    assert client.retried == 1
    stub.script = [(503, None), (200, None)]  # no Retry-After: AgentGym's own client does not retry a GET
    with pytest.raises(AssertionError, match="503"):
        client.observe()
