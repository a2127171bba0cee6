"""Errors as JSON: every bad input becomes a 4xx ``{"error": kind, "detail": message}``, never a 500.

Kinds and statuses (also the ``kind`` label of the ``agentrl_errors_total`` metric):

====================  ======  =====================================================================
kind                  status  when
====================  ======  =====================================================================
malformed_json        400     the body is not JSON (or not UTF-8)
bad_request           400     any other unreadable request
invalid_token         400     a state token that is tampered with, foreign (secret/catalog), or garbage
invalid_state         400     a signed state that does not fit the catalog
unknown_goal          404     a goal index out of range, or a goal set the catalog does not have
unknown_env           404     an AgentGym ``env_idx`` that is not a live session
goal_not_in_split     404     ``split`` was given and the goal lies outside it
not_found             404     no such path
method_not_allowed    405
episode_finished      409     a step after the purchase, or after the step limit truncated the episode
session_conflict      409     an AgentGym session changed during this request (a concurrent or retried one)
body_too_large        413     the body exceeds ``AGENTRL_MAX_BODY_BYTES``
validation_error      422     a field is missing or has the wrong type
batch_too_large       422     more steps in one batch than ``WEBSHOP_MAX_BATCH``
not_ready             503     the catalog is not open (yet, or any more)
session_store_down    503     the AgentGym session store (Redis) does not answer
internal_error        500     a bug: logged with its traceback, no details leak to the client
====================  ======  =====================================================================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..envs.contract import EnvError
from .compat_sessions import AlreadyAnswered, SessionConflict, SessionStoreUnavailable, UnknownSession
from .tokens import TokenError

log = logging.getLogger("agent_envs.api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ApiError(Exception):
    """An error the API layer raises itself (unknown compat session, goal outside a split, not ready, ...)."""

    def __init__(self, status: int, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail


def json_bytes(value: Any) -> bytes:
    """orjson, falling back to ``json`` (ASCII escapes) for text orjson refuses, e.g. lone surrogates."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=True, default=str).encode()


def error_response(status: int, kind: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json_bytes({"error": kind, "detail": detail}), status_code=status, media_type="application/json",
        headers=headers,
    )  # fmt: skip


def classify(error: Exception) -> tuple[int, str]:
    """(status, kind) of an error of the simulator or the token layer."""
    if isinstance(error, ApiError):
        return error.status, error.kind
    if isinstance(error, TokenError):
        return 400, "invalid_token"
    if isinstance(error, UnknownSession):
        return 404, "unknown_env"
    if isinstance(error, SessionConflict):
        return 409, "session_conflict"
    if isinstance(error, SessionStoreUnavailable):
        return 503, "session_store_down"
    if isinstance(error, EnvError):  # an environment's refusal says its own status and kind (envs.contract)
        return error.status, error.kind
    return 500, "internal_error"


def known_error_response(
    error: Exception, method: str, path: str, count: Callable[[str], None] | None = None
) -> Response:
    """The JSON answer to an exception a route raised (``classify``), counted by kind and logged where it is
    the server's side: the app's exception handlers and the AgentGym routes' fast path answer with this."""
    status, kind = classify(error)
    if count is not None:
        count(kind)
    if status == 503:
        log.warning("%s on %s %s: %s", kind, method, path, error)
        return error_response(status, kind, str(error), headers={"Retry-After": "1"})
    if status >= 500:
        log.error("unhandled error on %s %s", method, path, exc_info=error)
        return error_response(status, kind, "internal error; the server log has the details")
    return error_response(status, kind, getattr(error, "detail", None) or str(error))


def _count(request: Request, kind: str) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.errors.labels(kind).inc()


def _validation_detail(error: RequestValidationError) -> tuple[str, str]:
    parts = []
    for item in error.errors():
        if item.get("type") == "json_invalid":
            reason = (item.get("ctx") or {}).get("error", "invalid JSON")
            return "malformed_json", f"request body is not valid JSON: {reason}"
        location = ".".join(str(part) for part in item.get("loc", ()) if part != "body") or "body"
        parts.append(f"{location}: {item.get('msg', 'invalid')}")
    return "validation_error", "; ".join(parts) or "invalid request"


_HTTP_KINDS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception to a JSON error response (and count it by kind)."""

    async def on_known(request: Request, error: Exception) -> Response:
        return known_error_response(
            error, request.method, request.url.path, lambda kind: _count(request, kind)
        )

    async def on_validation(request: Request, error: RequestValidationError) -> Response:
        kind, detail = _validation_detail(error)
        _count(request, kind)
        return error_response(400 if kind == "malformed_json" else 422, kind, detail)

    async def on_http(request: Request, error: StarletteHTTPException) -> Response:
        kind = _HTTP_KINDS.get(
            error.status_code, "bad_request" if error.status_code < 500 else "internal_error"
        )
        detail = str(error.detail)
        if detail == "There was an error parsing the body":
            kind, detail = "malformed_json", "request body could not be read as UTF-8 JSON"
        elif error.status_code == 404 and detail == "Not Found":
            detail = f"no endpoint {request.method} {request.url.path}; see /openapi.json"
        _count(request, kind)
        return error_response(error.status_code, kind, detail, headers=getattr(error, "headers", None))

    async def on_answered(request: Request, error: AlreadyAnswered) -> Response:
        # A retry of a request that was applied already (the balancer re-sent it after its replica died, or the
        # client retried with its Idempotency-Key): the answer recorded with the change, as it was sent.
        return Response(error.answer.body, status_code=error.answer.status, media_type="application/json")

    app.add_exception_handler(AlreadyAnswered, on_answered)  # type: ignore[arg-type]
    session_errors = (UnknownSession, SessionConflict, SessionStoreUnavailable)
    for error_class in (ApiError, TokenError, EnvError, *session_errors, Exception):
        app.add_exception_handler(error_class, on_known)
    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive channel that yields messages already read from ``receive``, in order, then what comes next."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


class BodyLimitMiddleware:
    """Answers 413 to bodies above ``max_bytes``: by ``Content-Length`` up front, else while buffering.

    Chunked bodies (no ``Content-Length``) are read here up to the limit and replayed to the app, because the
    framework turns errors raised while it reads the body into a generic 400.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await self._reject(
                        scope, receive, send, 400, "bad_request", "invalid Content-Length header"
                    )
                    return
                break
        if length is not None:
            if length > self.max_bytes:
                await self._reject(scope, receive, send, 413, "body_too_large", self._too_large(length))
                return
            await self.app(scope, receive, send)
            return
        if scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the app answers that as usual
                read = {"type": "http.request", "body": b"".join(chunks), "more_body": True}
                await self.app(scope, replay([read, message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(scope, receive, send, 413, "body_too_large", self._too_large(None))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, replay([body], receive), send)

    def _too_large(self, length: int | None) -> str:
        size = f"{length} bytes" if length is not None else "the request body"
        return f"{size} exceeds the limit of {self.max_bytes} bytes (AGENTRL_MAX_BODY_BYTES)"

    async def _reject(
        self, scope: Scope, receive: Receive, send: Send, status: int, kind: str, detail: str
    ) -> None:
        if self.on_reject is not None:
            self.on_reject(kind)
        response = error_response(status, kind, detail, headers={"Connection": "close"})
        await response(scope, receive, send)
