"""The async client and its transport against real sockets: retries, errors, keep-alive, chunked bodies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from agent_envs import cluster
from agent_envs.client import ServiceRequestError, ServiceUnavailable, WebShopClient
from agent_envs.client.transport import LeanTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


def closed_port_url() -> str:
    return f"http://127.0.0.1:{cluster.free_ports(1)[0]}"


async def serve(handler: Handler, port: int = 0) -> tuple[asyncio.AbstractServer, str, list[int]]:
    """A raw HTTP/1.1 server on a free port; ``handler(reader, writer, n)`` answers request number ``n``."""
    counter = [0]

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                counter[0] += 1
                await handler(reader, writer, counter[0])
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", port)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", counter


def respond(writer: asyncio.StreamWriter, status: int, body: bytes, extra: bytes = b"") -> None:
    writer.write(
        b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
        % (status, len(body), extra, body)
    )


def test_unreachable_server_raises_unavailable_after_retries() -> None:
    async def main() -> None:
        async with WebShopClient(closed_port_url(), retries=2, backoff=0.01) as client:
            with pytest.raises(ServiceUnavailable, match="after 3 attempt"):
                await client.reset(1)
            assert await client.health() is False
            with pytest.raises(ServiceUnavailable, match="not ready within"):
                await client.wait_until_ready(timeout=0.3, interval=0.1)

    asyncio.run(main())


def test_retry_budget_is_spent_in_seconds_then_says_so() -> None:
    async def main() -> None:
        async with WebShopClient(
            closed_port_url(), retry_budget=1.0, backoff=0.02, max_backoff=0.1
        ) as client:
            with pytest.raises(ServiceUnavailable, match=r"retry budget 1 s\): ConnectError") as caught:
                await client.reset(1)
        attempts = int(str(caught.value).split(" after ")[1].split(" attempt")[0])
        assert attempts > 5  # kept trying for the whole second, not a fixed small count

    asyncio.run(main())


def test_client_rides_out_a_server_that_comes_back_within_the_budget() -> None:
    """Nothing listens for ~1.5 s (a balancer restarting), then the server answers: the call succeeds."""
    port = cluster.free_ports(1)[0]

    async def handler(reader, writer, n: int) -> None:
        respond(writer, 200, b'{"observation":"back","state":"s"}')
        await writer.drain()

    async def late_server() -> asyncio.AbstractServer:
        await asyncio.sleep(1.5)
        server, _, _ = await serve(handler, port)
        return server

    async def main() -> None:
        starting = asyncio.create_task(late_server())
        async with WebShopClient(
            f"http://127.0.0.1:{port}", retry_budget=30, backoff=0.05, max_backoff=0.2
        ) as client:
            assert (await client.reset(1))["observation"] == "back"
        (await starting).close()

    asyncio.run(main())


def test_5xx_is_retried_4xx_is_not() -> None:
    async def handler(reader, writer, n: int) -> None:
        if n <= 2:
            respond(writer, 503, b'{"error":"not_ready","detail":"wait"}')
        elif n == 3:
            respond(writer, 200, b'{"observation":"ok","state":"s"}')
        else:
            respond(writer, 409, b'{"error":"episode_finished","detail":"reset"}')
        await writer.drain()

    async def main() -> None:
        server, url, counter = await serve(handler)
        async with server, WebShopClient(url, retries=3, backoff=0.01) as client:
            assert (await client.reset(1))["observation"] == "ok"
            assert counter[0] == 3
            with pytest.raises(ServiceRequestError) as caught:
                await client.step("s", "search[x]")
            assert caught.value.status == 409 and caught.value.error == "episode_finished"
            assert counter[0] == 4  # no retry of a 4xx

    asyncio.run(main())


def test_server_closing_idle_keepalive_connections_is_transparent() -> None:
    async def handler(reader, writer, n: int) -> None:
        respond(writer, 200, b'{"n":%d}' % n)
        await writer.drain()
        writer.close()  # like a server whose keep-alive timeout ran out, without saying Connection: close

    async def main() -> None:
        server, url, counter = await serve(handler)
        async with server:
            transport = LeanTransport(max_connections=4)
            async with httpx.AsyncClient(base_url=url, transport=transport) as client:
                for expected in range(1, 11):
                    if expected % 2:  # every other time the close reaches us before the next request
                        await asyncio.sleep(0.01)
                    assert (await client.get("/")).json() == {"n": expected}

    asyncio.run(main())


def test_transport_reads_chunked_bodies_and_reuses_connections() -> None:
    connections = []

    async def handler(reader, writer, n: int) -> None:
        if writer not in connections:
            connections.append(writer)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            b'4\r\n{"n"\r\n3\r\n:%d}\r\n0\r\n\r\n' % n
        )
        await writer.drain()

    async def main() -> None:
        server, url, _ = await serve(handler)
        async with server, httpx.AsyncClient(base_url=url, transport=LeanTransport()) as client:
            for expected in range(1, 4):
                assert (await client.post("/x", json={"a": expected})).json() == {"n": expected}
        assert len(connections) == 1

    asyncio.run(main())


def test_transport_maps_timeouts_to_httpx_errors() -> None:
    async def handler(reader, writer, n: int) -> None:
        await asyncio.sleep(5)

    async def main() -> None:
        server, url, counter = await serve(handler)
        async with server:
            async with httpx.AsyncClient(base_url=url, transport=LeanTransport(), timeout=0.2) as client:
                with pytest.raises(httpx.ReadTimeout):
                    await client.get("/")
            async with WebShopClient(url, timeout=0.2, retries=1, backoff=0.01) as client:
                with pytest.raises(ServiceUnavailable, match="ReadTimeout"):
                    await client.step("s", "a")
            assert counter[0] == 3  # the timed-out step was tried twice

    asyncio.run(main())


def test_client_against_a_replica(replica) -> None:
    async def main() -> None:
        async with WebShopClient(replica.url) as client:
            await client.wait_until_ready(10)
            assert await client.health() is True
            goals = await client.goals(goal_set="synthetic", split="test")
            assert goals["goal_sets"]["synthetic"]["splits"]["test"]["count"] == 500
            first = await client.reset(600, goal_set="synthetic", split="eval")
            with pytest.raises(ServiceRequestError, match="not in the train split"):
                await client.reset(600, split="train")
            results = await client.step_batch(
                [(first["state"], "search[sofa]"), {"state": "bad", "action": "x"}]
            )
            assert results[0]["info"]["steps"] == 1 and results[1]["error"] == "invalid_token"

    asyncio.run(main())


def test_failed_address_moves_the_client_to_a_fallback_and_back_to_its_own_later() -> None:
    """Its own node's proxy refuses (a dead node): requests go to the next address at once, stay there while
    the own address is failing, and go back to it after ``primary_retry_s`` once it answers again."""
    port = cluster.free_ports(1)[0]

    async def fallback_handler(reader, writer, n: int) -> None:
        respond(writer, 200, b'{"observation":"fallback","state":"s"}')
        await writer.drain()

    async def own_handler(reader, writer, n: int) -> None:
        respond(writer, 200, b'{"observation":"own","state":"s"}')
        await writer.drain()

    async def main() -> None:
        fallback, fallback_url, fallback_count = await serve(fallback_handler)
        async with fallback, WebShopClient(
            f"http://127.0.0.1:{port}", fallback_urls=[fallback_url], retry_budget=10, backoff=0.01,
            primary_retry_s=0.5,
        ) as client:  # fmt: skip
            assert (await client.reset(1))["observation"] == "fallback"
            assert (await client.step("s", "search[x]"))["observation"] == "fallback"
            assert fallback_count[0] == 2 and client.url == fallback_url  # no new attempt at the dead address
            own, _, own_count = await serve(own_handler, port)
            async with own:
                await asyncio.sleep(0.6)
                assert (await client.reset(1))["observation"] == "own"
                assert own_count[0] == 1 and client.url == f"http://127.0.0.1:{port}"

    asyncio.run(main())


def test_every_address_failing_spends_the_budget_and_names_the_last_one() -> None:
    async def main() -> None:
        urls = [closed_port_url(), closed_port_url()]
        async with WebShopClient(urls[0], fallback_urls=urls[1:], retry_budget=0.5, backoff=0.02) as client:
            assert client.urls == urls
            with pytest.raises(ServiceUnavailable, match="ConnectError"):
                await client.reset(1)
            assert await client.health() is False

    asyncio.run(main())
