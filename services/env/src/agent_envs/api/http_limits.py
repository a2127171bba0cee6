"""Replica-side HTTP limits uvicorn lacks, and JSON instead of uvicorn's plain-text errors.

``agent-envs serve`` runs uvicorn with ``http=LimitedHttpToolsProtocol``, which adds to uvicorn's httptools
protocol:

- a **header timeout**: a connection must deliver a request's complete head (request line and headers)
  within ``AGENTRL_HEADER_TIMEOUT_S`` (10 s) of connecting, or of its first byte after a previous response;
  else it gets 408 and is closed. Without it a replica holds slow or silent connections forever
  (uvicorn's ``timeout_keep_alive`` only covers the idle time after a response);
- a **header size limit**: a head larger than ``AGENTRL_MAX_HEADER_BYTES`` (32 KiB) gets 431 and the
  connection is closed, before more of it is buffered;
- its own errors as the service's JSON ``{"error", "detail"}``: 400 for an unparsable request, and 503 when
  ``limit_concurrency`` is reached (uvicorn answers those in plain text).

The balancer has the same limits in front (``configs/nginx/balancer.conf.template``); these protect a replica
reached directly and bound what one connection can cost.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .errors import json_bytes

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_HEADER_BYTES = 32 * 1024


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


def _raw_response(status: int, reason: str, kind: str, detail: str) -> bytes:
    body = json_bytes({"error": kind, "detail": detail})
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def json_service_unavailable(scope: Any, receive: Any, send: Any) -> None:
    """uvicorn's answer at ``limit_concurrency``, as JSON."""
    body = json_bytes(
        {
            "error": "overloaded",
            "detail": "this replica is at its connection limit; retry (on another replica)",
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (b"retry-after", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


# uvicorn looks this name up in its module when a request arrives over the limit.
httptools_impl.service_unavailable = json_service_unavailable  # type: ignore[attr-defined]


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing an oversized head."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header timeout, a header size limit and JSON errors."""

    header_timeout_s = _env_number("AGENTRL_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S)
    max_header_bytes = int(_env_number("AGENTRL_MAX_HEADER_BYTES", DEFAULT_MAX_HEADER_BYTES))

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._in_head = True
        self._head_timer: asyncio.TimerHandle | None = None
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_timer is None:
                self._start_head_timer()
        try:
            super().data_received(data)
        except _HeadTooLarge:
            self._reject_large_head()
            return
        # a head still incomplete after this many bytes (the parser buffers a partial header itself)
        if self._in_head and self._head_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._reject_large_head()

    def on_message_begin(self) -> None:
        self._parsed_head_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._in_head = True  # the next request's head; its timer starts with its first byte
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        if getattr(self, "_parsed_head_bytes", 0) > self.max_header_bytes:
            self._reject_large_head()  # httptools reports our callback's exception as a parser error
            return
        self._cancel_head_timer()
        self.transport.write(_raw_response(400, "Bad Request", "bad_request", f"{msg} (not valid HTTP/1.1)"))
        self.transport.close()

    # ---- internals -------------------------------------------------------------------------------------
    def _count_head(self, size: int) -> None:
        self._parsed_head_bytes = getattr(self, "_parsed_head_bytes", 0) + size
        if self._parsed_head_bytes > self.max_header_bytes:
            raise _HeadTooLarge

    def _reject_large_head(self) -> None:
        self._reject(
            431, "Request Header Fields Too Large", "header_too_large",
            f"the request line and headers exceed {self.max_header_bytes} bytes (AGENTRL_MAX_HEADER_BYTES)",
        )  # fmt: skip

    def _start_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._reject(
                408, "Request Timeout", "request_timeout",
                f"no complete request head within {self.header_timeout_s:g} s (AGENTRL_HEADER_TIMEOUT_S)",
            )  # fmt: skip

    def _reject(self, status: int, reason: str, kind: str, detail: str) -> None:
        self._cancel_head_timer()
        self.transport.write(_raw_response(status, reason, kind, detail))
        self.transport.close()
