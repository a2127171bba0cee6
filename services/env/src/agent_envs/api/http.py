"""What every environment's routes share: JSON responses, request limits, the error schema, reading a body in
front of the framework (the fast paths), and who the client is behind the balancer.

The serving layer's own routes (``routes_envs``) and an environment package's routes of its own (WebShop's,
``envs.webshop.http``) use these, so a request is read, limited and answered the same way on every route.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import orjson
from fastapi import Request
from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from .compat_sessions import MAX_REQUEST_KEY
from .errors import json_bytes

# Longer actions are no real action (an instruction is ~300 characters); the cap also bounds what a query can
# make a search cache hold. Every route's text fields are held to it.
MAX_ACTION_CHARS = 2048
# A request body has a handful of brackets; Python's JSON parser, which the routes use, gives up on nesting in the
# hundreds, orjson only past 1,023 levels: bodies with more brackets go to the route.
MAX_FAST_BRACKETS = 64


def package_version() -> str:
    """The installed distribution's version (the app's and ``/v1/info``'s)."""
    try:
        return metadata.version("agent-envs")
    except metadata.PackageNotFoundError:
        return "unknown"


def json_response(value: Any, status: int = 200) -> Response:
    """Serialize with orjson and skip FastAPI's response-model pass (the models document the shapes)."""
    return Response(json_bytes(value), status_code=status, media_type="application/json")


def utf8_text(value: str) -> str:
    """Reject lone surrogates (JSON ``"\\ud800"``): they cannot be encoded into a response or a token."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text (no lone surrogate escapes)") from None
    return value


class ErrorResponse(BaseModel):
    error: str
    detail: str


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 404, 409, 413, 422, 503)
}


# ---- the client behind the balancer ------------------------------------------------------------------------
def client_address(request: Request) -> str:
    """The client as the balancer saw it: the unit of the per-client session quota (``forwarded_client``)."""
    return forwarded_client(
        request.headers.get("x-forwarded-for"), request.client.host if request.client else None
    )


def forwarded_client(forwarded: str | None, peer: str | None) -> str:
    """The last ``X-Forwarded-For`` entry (the one nginx appends), else the peer address."""
    if forwarded:
        last = forwarded.rsplit(",", 1)[-1].strip()
        if last:
            return last[:64]
    return peer or "unknown"


def header_key(request: Request) -> str | None:
    """What makes a state-changing request exactly-once (``compat_sessions.request_key``; ``key_header``)."""
    return key_header(request.headers.get("idempotency-key"), request.headers.get("x-request-id"))


def key_header(idempotency_key: str | None, request_id: str | None) -> str | None:
    """The client's ``Idempotency-Key``, else the balancer's ``X-Request-Id`` (nginx's ``$request_id``, the same
    for every attempt of one request). A value that is not visible ASCII of at most ``MAX_REQUEST_KEY``
    characters is no key (the request is applied as a new one, as without the header)."""
    for value in (idempotency_key, request_id):
        if (
            value
            and len(value) <= MAX_REQUEST_KEY
            and value.isascii()
            and value.isprintable()
            and " " not in value
        ):
            return value
    return None


# ---- reading and answering in front of the framework (the fast paths) ---------------------------------------
def json_object(scope: Scope, body: bytes) -> dict[str, Any] | None:
    """A fast path's reading of a request body: the JSON object a route would parse it to, or None when the route
    should answer (not JSON by its content type, not an object, not JSON at all, or possibly nested deeper than
    the route's JSON parser goes: it answers 400 there)."""
    if not is_json(scope) or body.count(b"[") + body.count(b"{") > MAX_FAST_BRACKETS:
        return None
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return value if type(value) is dict else None


async def read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """Every message of a request's body (to replay them to the framework if need be), and the body; None when
    the client went away before it was complete."""
    messages = [await receive()]
    while messages[-1]["type"] == "http.request" and messages[-1].get("more_body", False):
        messages.append(await receive())
    if messages[-1]["type"] != "http.request":
        return messages, None
    return messages, b"".join([m.get("body", b"") for m in messages])


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A complete JSON response, with the headers a framework route's ``Response`` sends."""
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-length", b"%d" % len(body)), (b"content-type", b"application/json"), *(headers or ()),
    ]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    """The first value of a request header (names arrive lower-cased), or None."""
    for name, value in scope["headers"]:
        if name == wanted:
            return value
    return None


def content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``, or None when it has none or one that is not a number."""
    value = _header(scope, b"content-length")
    return int(value) if value is not None and value.isdigit() else None


def is_json(scope: Scope) -> bool:
    """Content type application/json (as FastAPI parses a body as JSON); other types go to the route."""
    value = _header(scope, b"content-type")
    return value is not None and value.split(b";", 1)[0].strip().lower() == b"application/json"
