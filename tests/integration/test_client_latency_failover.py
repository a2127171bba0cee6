"""The native client leaves a slow but live address, not only a failing one (issue 29).

A real replica (``agent-envs serve``) is reached through a local TCP proxy that holds every answer back for
a while, like a node behind a throttled link: nothing fails, every answer is only late, so a client that
fails over on errors alone keeps playing through it. With a fallback address the client hedges a reset or
step that has no answer after ``hedge_after`` on the next address, takes the first answer, and moves there.
When every address is slow, the hedge does not help and hedging pauses (no doubled load on a busy service).
No wall-clock assertions: the test counts which address served which request.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agent_envs.client import EnvClient, WebShopClient

pytestmark = pytest.mark.timeout(300)


class SlowLink:
    """A TCP proxy to ``upstream`` that forwards requests at once and every answer after ``delay`` seconds."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port = upstream_port
        self.delay = delay
        self.requests = 0  # request heads forwarded (a POST or GET line)
        self.server: asyncio.AbstractServer | None = None
        self.url = ""

    async def __aenter__(self) -> SlowLink:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(Exception):
            await self.server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, slow: bool) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while chunk := await source.read(65536):
                    if slow:
                        await asyncio.sleep(self.delay)
                    else:
                        self.requests += chunk.count(b" HTTP/1.1\r\n")
                    sink.write(chunk)
                    await sink.drain()
            with contextlib.suppress(Exception):
                sink.close()

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_slow_address_is_left_for_a_fast_one(replica, expert_plans) -> None:
    goal, actions = next(iter(expert_plans.items()))

    async def play() -> tuple[float, WebShopClient, SlowLink]:
        async with (
            SlowLink(replica.port, delay=2.0) as slow,
            WebShopClient(slow.url, fallback_urls=[replica.url], hedge_after=0.2) as client,
        ):
            step = await client.reset(goal, goal_set="synthetic")
            for action in actions:
                step = await client.step(step["state"], action)
            return step["reward"], client, slow

    reward, client, slow = asyncio.run(play())
    assert reward == 1.0
    assert client.hedged >= 1 and client.hedge_wins >= 1
    assert client.url == replica.url  # the client moved to the fast address
    # only the first request went through the slow link: every step after it went to the fast address
    assert slow.requests == 1, f"{slow.requests} requests of {len(actions) + 1} went through the slow link"


def test_hedging_pauses_when_every_address_is_slow(replica, expert_plans) -> None:
    goal, actions = next(iter(expert_plans.items()))

    async def play() -> tuple[float, WebShopClient, SlowLink, SlowLink]:
        async with (
            SlowLink(replica.port, delay=0.6) as first,
            SlowLink(replica.port, delay=3.0) as second,
            WebShopClient(first.url, fallback_urls=[second.url], hedge_after=0.2) as client,
        ):
            step = await client.reset(goal, goal_set="synthetic")
            for action in actions:
                step = await client.step(step["state"], action)
            return step["reward"], client, first, second

    reward, client, first, second = asyncio.run(play())
    assert reward == 1.0
    # the first request was hedged, the first address still answered first: hedging paused after that
    assert (client.hedged, client.hedge_wins) == (1, 0)
    assert client.url == first.url and first.requests == len(actions) + 1 and second.requests == 1


def test_sciworld_steps_are_never_hedged() -> None:
    assert EnvClient("http://127.0.0.1:1", "sciworld", fallback_urls=["http://127.0.0.1:2"])._hedge is False
    assert EnvClient("http://127.0.0.1:1", "textcraft", fallback_urls=["http://127.0.0.1:2"])._hedge is True
    with pytest.raises(ValueError):
        WebShopClient("http://127.0.0.1:1", hedge_after=0)
