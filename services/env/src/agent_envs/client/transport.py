"""A lean HTTP/1.1 keep-alive transport for ``httpx.AsyncClient``, for hundreds of concurrent requests.

Why: httpcore's pool rescans every connection (and polls each idle socket) on every request, so at a few
hundred concurrent episodes the client burns milliseconds of CPU per request and becomes the bottleneck of
a training or benchmark run. This transport keeps idle connections in a LIFO stack per origin (O(1) per
request) and parses responses with a few lines of code. It speaks plain HTTP/1.1 to our own servers (uvicorn,
nginx): ``Content-Length`` or chunked bodies, no TLS, no proxies, no HTTP/2 (use httpx's default transport for
anything else).

Failures surface as httpx's exception classes (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``,
``WriteTimeout``, ``PoolTimeout``, ``RemoteProtocolError``, ``ReadError``), so callers handle both transports
alike. A request that fails on a reused keep-alive connection before any response byte arrived (the server
closed it while idle) is sent once more on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
MAX_HEADER_BYTES = 64 * 1024


class _StaleConnection(Exception):
    """The reused connection was closed by the server before it answered."""


class _Connection:
    __slots__ = ("idle_since", "reader", "reused", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()
        self.reused = False

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


async def _within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """``await`` with a time limit (asyncio.TimeoutError); ``asyncio.timeout`` where it exists: no extra task."""
    if seconds is None:
        return await awaitable
    if _timeout is not None:
        async with _timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 transport with a per-origin LIFO pool of keep-alive connections.

    Args:
        max_connections: open connections at most (requests beyond wait, up to the pool timeout).
        keepalive_expiry: idle connections older than this are closed instead of reused (seconds); keep it
            below the server's keep-alive timeout (uvicorn here: 75 s, nginx: 75 s).
    """

    def __init__(self, max_connections: int = 512, keepalive_expiry: float = 30.0) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"LeanTransport speaks plain http only, not {request.url.scheme}")
        if self._closed:
            raise httpx.ConnectError("the transport is closed", request=request)
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        try:
            if self._slots.locked():
                await _within(self._slots.acquire(), timeouts.get("pool"))
            else:
                await self._slots.acquire()
        except asyncio.TimeoutError:
            raise httpx.PoolTimeout("no free connection in the pool in time", request=request) from None
        try:
            payload = self._serialize(request, await request.aread())
            origin = (request.url.host, request.url.port or 80)
            for attempt in range(2):
                connection = await self._checkout(origin, request, timeouts.get("connect"), fresh=attempt > 0)
                try:
                    status, headers, body, keep = await self._exchange(connection, payload, request, timeouts)
                except _StaleConnection:
                    # The server restarted or timed its idle connections out: the others are stale too.
                    connection.close()
                    self._drop_idle(origin)
                    continue  # once more, on a fresh connection
                except BaseException:
                    connection.close()
                    raise
                if keep and not self._closed:
                    connection.idle_since = time.monotonic()
                    connection.reused = True
                    self._idle.setdefault(origin, []).append(connection)
                else:
                    connection.close()
                return httpx.Response(
                    status, headers=headers, content=body, extensions={"http_version": b"HTTP/1.1"}
                )
            raise httpx.RemoteProtocolError("server closed the connection without answering", request=request)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    # ---- internals -------------------------------------------------------------------------------------
    def _drop_idle(self, origin: tuple[str, int]) -> None:
        for connection in self._idle.pop(origin, []):
            connection.close()

    async def _checkout(
        self, origin: tuple[str, int], request: httpx.Request, timeout: float | None, fresh: bool = False
    ) -> _Connection:
        idle = None if fresh else self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < self.keepalive_expiry and not connection.reader.at_eof():
                return connection
            connection.close()
        try:
            reader, writer = await _within(asyncio.open_connection(origin[0], origin[1]), timeout)
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(
                f"connecting to {origin[0]}:{origin[1]} timed out", request=request
            ) from None
        except OSError as error:
            raise httpx.ConnectError(
                f"cannot connect to {origin[0]}:{origin[1]}: {error}", request=request
            ) from None
        return _Connection(reader, writer)

    @staticmethod
    def _serialize(request: httpx.Request, body: bytes) -> bytes:
        target = request.url.raw_path.decode("ascii")
        lines = [f"{request.method} {target} HTTP/1.1".encode("ascii")]
        has_length = False
        for name, value in request.headers.raw:
            lowered = name.lower()
            if lowered == b"content-length":
                has_length = True
            elif lowered == b"transfer-encoding":
                continue  # the body is sent whole, with a Content-Length
            lines.append(name + b": " + value)
        if not has_length and (body or request.method in ("POST", "PUT", "PATCH")):
            lines.append(b"Content-Length: " + str(len(body)).encode("ascii"))
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    async def _exchange(
        self, connection: _Connection, payload: bytes, request: httpx.Request, timeouts: dict[str, Any]
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        try:
            connection.writer.write(payload)
            if connection.writer.transport.get_write_buffer_size():
                await _within(connection.writer.drain(), timeouts.get("write"))
        except asyncio.TimeoutError:
            raise httpx.WriteTimeout("sending the request timed out", request=request) from None
        except OSError as error:
            if connection.reused:
                raise _StaleConnection from None
            raise httpx.WriteError(f"sending the request failed: {error}", request=request) from None
        try:
            return await _within(self._read_response(connection, request), timeouts.get("read"))
        except asyncio.TimeoutError:
            raise httpx.ReadTimeout("the server did not answer in time", request=request) from None

    async def _read_response(
        self, connection: _Connection, request: httpx.Request
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        reader = connection.reader
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as error:
            if not error.partial and connection.reused:
                raise _StaleConnection from None
            raise httpx.RemoteProtocolError(
                "server disconnected without a complete answer", request=request
            ) from None
        except asyncio.LimitOverrunError:
            raise httpx.RemoteProtocolError("response headers too large", request=request) from None
        except OSError as error:
            if connection.reused:
                raise _StaleConnection from None
            raise httpx.ReadError(f"reading the answer failed: {error}", request=request) from None
        try:
            status_line, *header_lines = head[:-4].split(b"\r\n")
            version, status_text = status_line.split(b" ", 2)[:2]
            status = int(status_text)
            headers = []
            for line in header_lines:
                name, _, value = line.partition(b":")
                headers.append((name.strip(), value.strip()))
        except ValueError:
            raise httpx.RemoteProtocolError("malformed response head", request=request) from None
        length = None
        chunked = False
        keep = version == b"HTTP/1.1"
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise httpx.RemoteProtocolError("malformed Content-Length", request=request) from None
            elif lowered == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif lowered == b"connection":
                token = value.lower()
                keep = b"close" not in token and (keep or b"keep-alive" in token)
        try:
            if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                body = b""
            elif chunked:
                body = await self._read_chunked(reader)
            elif length is not None:
                body = await reader.readexactly(length)
            else:
                body = await reader.read()
                keep = False
        except (asyncio.IncompleteReadError, OSError, ValueError):
            raise httpx.RemoteProtocolError(
                "server disconnected in the middle of the body", request=request
            ) from None
        return status, headers, body, keep

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
