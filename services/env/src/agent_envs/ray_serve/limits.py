"""The balancer's request limits on Ray Serve's HTTP proxy (the env's ``make up-ray`` / ``serve-ray`` path).

nginx bounds every request before a replica sees it (``configs/nginx/balancer.conf.template``): request line and
headers within 10 s and 32 KiB (431 above), a body within 10 s between reads (408) and 1 MiB (413), and
every error it makes itself as the service's JSON ``{"error", "detail"}``. Serve's proxy (uvicorn, inside a
Ray actor on every node) has none of these: it buffers a 1 MiB header, holds a half-sent request head or body
forever, and answers non-HTTP bytes with uvicorn's plain text. ``deploy`` gives it the same limits through
the one hook Ray offers into that actor (HTTP options' ``middlewares`` are refused since Ray 2.60): the
import path in ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``, a function the proxy calls when it starts, which
returns Starlette middlewares for its ASGI app. That variable must be in the proxy's environment: ``deploy``
puts it, with the limits, into the Serve controller's runtime environment (``serve.start``'s
``controller_options``, Ray 2.60), which the proxies it creates inherit. What the proxy then runs:

- ``LimitsMiddleware``, in the proxy before Serve routes the request: the header size (a backstop), the
  body's size (``Content-Length`` or counted) and the time between its reads, answered as JSON; the body is
  read whole in the proxy (at most ``max_body_bytes``) and handed on, so a replica never waits for a slow
  client;
- when the middleware is built, in the proxy's process (before Serve starts its uvicorn server), uvicorn's
  ``auto`` HTTP protocol becomes the replicas' own ``LimitedHttpToolsProtocol`` (``api/http_limits.py``):
  the header timeout and size limit before the head is parsed, and JSON for unparsable bytes. That is a
  process-wide setting of the proxy actor, so it holds for every Serve app on the cluster.

``serve deploy`` gets the same through the config file's ``controller_options`` (``serve-ray --write-config``
writes them). Ray without ``controller_options`` (2.49): set the variables of ``ProxyLimits.proxy_env`` in the
environment of ``ray start`` on every node.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api.errors import ASGIApp, Message, Receive, Scope, Send, json_bytes

#: nginx's ``client_max_body_size`` (the app's own limit, ``AGENTRL_MAX_BODY_BYTES``, is lower: 64 KiB).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: nginx's ``client_body_timeout``: the longest wait for the next piece of a body.
DEFAULT_BODY_TIMEOUT_S = 10.0
#: The replicas' and nginx's request-head limits (``api/http_limits.py``).
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_HEADER_BYTES = 32 * 1024


@dataclass(frozen=True)
class ProxyLimits:
    """What Serve's proxy accepts: request head within ``header_timeout_s`` and ``max_header_bytes``, body
    within ``max_body_bytes`` with at most ``body_timeout_s`` between two of its reads."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and 0 < value <= 3600):
                raise ValueError(f"{name} must be a number of seconds in (0, 3600], not {value!r}")
        for name in ("max_header_bytes", "max_body_bytes"):
            value = getattr(self, name)
            if not (isinstance(value, int) and 1024 <= value <= 1 << 30):
                raise ValueError(f"{name} must be a byte count between 1 KiB and 1 GiB, not {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ProxyLimits:
        """From ``AGENTRL_HEADER_TIMEOUT_S``, ``AGENTRL_MAX_HEADER_BYTES`` (the replicas' names),
        ``AGENTRL_BODY_TIMEOUT_S`` and ``AGENTRL_PROXY_MAX_BODY_BYTES``; the defaults where unset."""
        values: dict[str, Any] = {}
        for field, name, kind in (
            ("header_timeout_s", "AGENTRL_HEADER_TIMEOUT_S", float),
            ("max_header_bytes", "AGENTRL_MAX_HEADER_BYTES", int),
            ("body_timeout_s", "AGENTRL_BODY_TIMEOUT_S", float),
            ("max_body_bytes", "AGENTRL_PROXY_MAX_BODY_BYTES", int),
        ):
            raw = environ.get(name, "").strip()
            if raw:
                try:
                    values[field] = kind(raw)
                except ValueError:
                    raise ValueError(f"{name}={raw!r} is not a {kind.__name__}") from None
        return cls(**values)

    def proxy_env(self) -> dict[str, str]:
        """The environment that gives Serve's proxies these limits (the callback and the values it reads)."""
        return {
            PROXY_CALLBACK_VARIABLE: PROXY_CALLBACK,
            "AGENTRL_HEADER_TIMEOUT_S": f"{self.header_timeout_s:g}",
            "AGENTRL_MAX_HEADER_BYTES": str(self.max_header_bytes),
            "AGENTRL_BODY_TIMEOUT_S": f"{self.body_timeout_s:g}",
            "AGENTRL_PROXY_MAX_BODY_BYTES": str(self.max_body_bytes),
        }


#: Ray Serve's hook: a function its HTTP proxy calls when it starts, returning Starlette middlewares.
PROXY_CALLBACK_VARIABLE = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "agent_envs.ray_serve.limits:proxy_middlewares"


def proxy_middlewares() -> list[Any]:
    """Serve's proxy callback (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``): the limits of this process's
    environment (``ProxyLimits.from_env``) as a Starlette ``Middleware``."""
    from starlette.middleware import Middleware

    return [Middleware(LimitsMiddleware, limits=ProxyLimits.from_env())]


def install_protocol(limits: ProxyLimits) -> bool:
    """Make this process's uvicorn servers with ``http="auto"`` (Serve's proxy) speak the replicas'
    ``LimitedHttpToolsProtocol`` with ``limits``' head timeout and size; False where httptools is missing
    (uvicorn then runs h11, whose own head limit is 16 KiB, without a head timeout)."""
    try:
        import uvicorn.config

        from ..api.http_limits import LimitedHttpToolsProtocol
    except ImportError:
        return False
    global ProxyHttpProtocol
    ProxyHttpProtocol = type(
        "ProxyHttpProtocol",
        (LimitedHttpToolsProtocol,),
        {"header_timeout_s": limits.header_timeout_s, "max_header_bytes": limits.max_header_bytes},
    )
    uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:ProxyHttpProtocol"
    return True


ProxyHttpProtocol: Any = None  # set by install_protocol; uvicorn imports it by this name


class LimitsMiddleware:
    """ASGI middleware in Serve's proxy: the body read whole within the limits, else a JSON error."""

    def __init__(self, app: ASGIApp, limits: ProxyLimits | None = None) -> None:
        self.app = app
        self.limits = limits or ProxyLimits()
        self.protocol_installed = install_protocol(self.limits)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits
        head = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        head += sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))
        if head > limits.max_header_bytes:  # only without the protocol above (it answers before parsing)
            await _error(send, 431, "header_too_large",
                         f"the request line and headers exceed {limits.max_header_bytes} bytes")  # fmt: skip
            return
        declared = _content_length(scope)
        if declared == -1:
            await _error(send, 400, "bad_request", "Content-Length is not a non-negative integer")
            return
        if declared is not None and declared > limits.max_body_bytes:
            await _error(send, 413, "body_too_large", _too_large(limits))
            return
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), limits.body_timeout_s)
            except asyncio.TimeoutError:
                await _error(send, 408, "request_timeout",
                             f"the request body stalled for {limits.body_timeout_s:g} s")  # fmt: skip
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limits.max_body_bytes:
                await _error(send, 413, "body_too_large", _too_large(limits))
                return
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        whole: Message | None = {"type": "http.request", "body": b"".join(parts), "more_body": False}

        async def replay() -> Message:
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    """The declared body size; None without the header, -1 when it is unreadable."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return -1
            return length if length >= 0 else -1
    return None


def _too_large(limits: ProxyLimits) -> str:
    return f"the request body exceeds the proxy's limit of {limits.max_body_bytes} bytes"


async def _error(send: Send, status: int, kind: str, detail: str) -> None:
    """The service's JSON error, and the connection closed after it (the rest of the request is unread)."""
    body = json_bytes({"error": kind, "detail": detail})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
