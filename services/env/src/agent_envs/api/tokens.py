"""State tokens: the episode state, signed, so that any replica can serve the next step.

Format (version 2)::

    v2.<payload>.<mac>
    body    = orjson({"f": data fingerprint prefix, "d": the state as JSON})
    payload = base64url(body)            if len(body) <= COMPRESS_ABOVE (1 KB: every usual state)
              base64url(zlib(body))      otherwise (a query of several hundred characters)
    mac     = base64url(HMAC-SHA256(secret, "v2." + payload + "." + full data fingerprint))

The decoder tells the two payloads apart by their first byte: a JSON object starts with ``{``, a zlib stream
never does (its first byte's low four bits are 8). Version 1 tokens (``v1.``, always zlib) are still read,
so episodes in flight survive an upgrade of the replicas.

The full fingerprint of the data behind the state (WebShop's catalog, another environment's tasks) is bound
into the MAC without travelling in the token, so a token made for other data never verifies; its short prefix
does travel, so the error can say "another catalog" (or data set) rather than just "bad signature". The payload is only decoded after the MAC checks out (apart from that diagnosis,
which decompresses at most a bounded number of bytes), so a forged token cannot feed the decoder.
Base64url is unpadded, so a token is safe in JSON, URLs and headers.

Cost: a step decodes one token and encodes one, so the codec is on every request's path. A state is ~150
bytes of JSON, ~400 with an instruction-length query, that zlib shrinks by a fifth to a third, while setting up
a compressor and an inflater was the largest single cost of a replica's step (profiled under load): states up
to 1 KB travel uncompressed (a token some 200 bytes longer, next to a ~2 KB response). Longer ones (a query
near its 2,048-character cap) are compressed with a 4 KB window and a small hash table (``ZLIB_WBITS``,
``ZLIB_MEM_LEVEL``); the decoder reads the window size from the stream's header, so tokens made with other
parameters still decode. The HMAC's keyed state is set up once and copied per token.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import zlib
from collections.abc import Callable
from typing import Any

import orjson

from ..envs.contract import BadState

VERSION = "v2"
READABLE_VERSIONS = ("v1", "v2")  # v1: the payload is always zlib
COMPRESS_ABOVE = 1024  # bytes of JSON; a state is ~150, ~400 with an instruction-length query
FINGERPRINT_PREFIX = 12
MAX_PAYLOAD_BYTES = 1 << 20  # decompressed; a real state is a few hundred bytes
ZLIB_LEVEL = 1
ZLIB_WBITS = 12  # 4 KB window: a state is at most a few KB (the query is capped at 2,048 characters)
ZLIB_MEM_LEVEL = 2
_SIGNED_PREFIX = f"{VERSION}.".encode()
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


class TokenError(ValueError):
    """A state token that this service must not accept; the message says why and what to do."""


def _b64(data: bytes) -> bytes:
    """Unpadded base64url."""
    return binascii.b2a_base64(data, newline=False).translate(_TO_URLSAFE).rstrip(b"=")


def _b64decode(text: str) -> bytes:
    """Unpadded base64url to bytes, exactly as ``base64.urlsafe_b64decode`` of the padded text decodes it."""
    raw = text.encode("ascii")  # UnicodeEncodeError (a ValueError) for non-ASCII text
    return binascii.a2b_base64(raw.translate(_FROM_URLSAFE) + b"=" * (-len(raw) % 4))


def _as_it_is(value: Any) -> Any:
    """A JSON state travels as it is."""
    return value


def _compress(data: bytes) -> bytes:
    compressor = zlib.compressobj(ZLIB_LEVEL, zlib.DEFLATED, ZLIB_WBITS, ZLIB_MEM_LEVEL)
    return compressor.compress(data) + compressor.flush()


class TokenCodec:
    """Signs and verifies state tokens for one (secret, data) pair.

    ``fingerprint`` names the data behind the states (an environment's ``token_binding()``, else its id and
    ``fingerprint()``; WebShop: the catalog's), so a token of one environment or data set never verifies as
    another's. A state travels as ``to_data(state)`` (JSON) and comes back as ``from_data(json)``: the identity for
    an environment whose state is JSON already. ``data_name`` says in a refusal what the token was made for.
    """

    def __init__(
        self,
        secret: bytes,
        fingerprint: str,
        to_data: Callable[[Any], Any] = _as_it_is,
        from_data: Callable[[Any], Any] = _as_it_is,
        data_name: str = "data set",
    ) -> None:
        if not secret:
            raise ValueError("the state secret must not be empty")
        self.fingerprint = fingerprint
        self._to_data, self._from_data, self._data_name = to_data, from_data, data_name
        self._prefix = fingerprint[:FINGERPRINT_PREFIX]
        self._suffix = ("." + fingerprint).encode()
        # Keyed once, copied per token (no key setup per MAC); OpenSSL's object itself where it backs hmac.
        keyed = hmac.new(secret, digestmod=hashlib.sha256)
        self._keyed = getattr(keyed, "_hmac", keyed)

    def _mac(self, signed: bytes) -> bytes:
        mac = self._keyed.copy()
        mac.update(signed + self._suffix)
        return mac.digest()

    def encode(self, state: Any) -> str:
        body = orjson.dumps({"f": self._prefix, "d": self._to_data(state)})
        signed = _SIGNED_PREFIX + _b64(body if len(body) <= COMPRESS_ABOVE else _compress(body))
        return (signed + b"." + _b64(self._mac(signed))).decode("ascii")

    def decode(self, token: object) -> Any:
        """The state in ``token``; raises ``TokenError`` for anything not signed by us for this data."""
        if not isinstance(token, str) or not token:
            raise TokenError(
                "the state token must be a non-empty string (the `state` of the previous response)"
            )
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenError(
                "malformed state token: expected three dot-separated parts; pass `state` unchanged"
            )
        version, payload, mac_text = parts
        if version not in READABLE_VERSIONS:
            raise TokenError(
                f"unsupported state token version {version[:16]!r} (this server reads "
                f"{', '.join(READABLE_VERSIONS)}); "
                "reset the episode to get a fresh token"
            )
        try:
            mac = _b64decode(mac_text)
            signed = f"{version}.{payload}".encode("ascii")
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise TokenError("malformed state token: not base64url; pass `state` unchanged") from None
        if not hmac.compare_digest(mac, self._mac(signed)):
            raise TokenError(self._diagnose(version, payload))
        try:
            data = orjson.loads(self._body(version, payload))
            return self._from_data(data["d"])
        except (BadState, orjson.JSONDecodeError, KeyError, TypeError, ValueError, zlib.error) as error:
            raise TokenError(f"malformed state token payload: {error}") from None

    @staticmethod
    def _body(version: str, payload: str) -> bytes:
        """The JSON a payload carries: as it is (v2, starts with ``{``) or inflated (a zlib stream)."""
        raw = _b64decode(payload)
        if version != "v1" and raw[:1] == b"{":
            if len(raw) > MAX_PAYLOAD_BYTES:
                raise ValueError("state payload too large")
            return raw
        inflater = zlib.decompressobj(0)  # 0: the window size in the stream's header (allocates no more)
        data = inflater.decompress(raw, MAX_PAYLOAD_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError("state payload too large")
        return data

    def _diagnose(self, version: str, payload: str) -> str:
        """Why the MAC did not match: another catalog (if the payload says so), else tampering/another key."""
        try:
            prefix = orjson.loads(self._body(version, payload)).get("f")
        except Exception:  # the payload is attacker-controlled: any failure just means "bad signature"
            prefix = None
        if isinstance(prefix, str) and prefix != self._prefix:
            return (
                f"state token was made for another {self._data_name} (fingerprint {prefix[:FINGERPRINT_PREFIX]}…, this "
                f"server serves {self._prefix}…); reset the episode on this deployment"
            )
        return (
            "state token signature does not match: it was modified, or signed by a deployment with another "
            "AGENTRL_STATE_SECRET; pass `state` unchanged, and give all replicas the same secret"
        )
