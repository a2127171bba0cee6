"""State tokens and the AgentGym session store, directly (no HTTP)."""

from __future__ import annotations

import base64
import zlib

import orjson
import pytest

from agent_envs.api.compat_sessions import CompatSessions, UnknownSession
from agent_envs.api.tokens import TokenError
from agent_envs.envs.webshop.core.env import EpisodeState
from agent_envs.envs.webshop.core.pages import PageKind
from agent_envs.envs.webshop.http import token_codec

FINGERPRINT = "a54d05279e77cd0c"


def test_token_round_trip_keeps_every_field() -> None:
    codec = token_codec(b"k" * 32, FINGERPRINT)
    state = EpisodeState(
        goal_set="human", goal=12, page=PageKind.ITEM, query="red shoes [x] é", page_num=3, product=41,
        options={"size": "9", "color": "navy"}, sub_page=None, steps=7, reward=None,
    )  # fmt: skip
    token = codec.encode(state)
    assert token.count(".") == 2 and token.isascii()
    assert codec.decode(token) == state
    assert list(codec.decode(token).options) == ["size", "color"]  # click order survives


def test_token_rejections_name_the_cause() -> None:
    codec = token_codec(b"k" * 32, FINGERPRINT)
    token = codec.encode(EpisodeState(goal_set="synthetic", goal=1))
    with pytest.raises(TokenError, match="another AGENTRL_STATE_SECRET"):
        token_codec(b"j" * 32, FINGERPRINT).decode(token)
    with pytest.raises(TokenError, match="another catalog"):
        token_codec(b"k" * 32, "ffffffffffffffff").decode(token)
    with pytest.raises(TokenError, match="version"):
        codec.decode("v0" + token[2:])
    for garbage in (None, 5, "", "a.b", "a.b.c.d"):
        with pytest.raises(TokenError):
            codec.decode(garbage)


def test_decompression_bomb_is_rejected_without_inflating_it() -> None:
    codec = token_codec(b"k" * 32, FINGERPRINT)
    bomb = base64.urlsafe_b64encode(zlib.compress(b"{" + b" " * (50 << 20), 9)).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="signature"):
        codec.decode(f"v1.{bomb}.AAAA")


def test_signed_payload_with_a_broken_state_is_a_token_error() -> None:
    codec = token_codec(b"k" * 32, FINGERPRINT)
    body = base64.urlsafe_b64encode(zlib.compress(orjson.dumps({"f": FINGERPRINT[:12], "d": {"g": 1}})))
    signed = "v1." + body.rstrip(b"=").decode()
    mac = base64.urlsafe_b64encode(codec._mac(signed.encode())).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="malformed"):
        codec.decode(f"{signed}.{mac}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state(goal: int) -> EpisodeState:
    return EpisodeState(goal_set="synthetic", goal=goal)


def test_sessions_cap_evicts_least_recently_used() -> None:
    clock = Clock()
    evictions: list[tuple[str, int]] = []
    sizes: list[int] = []
    store = CompatSessions(
        3, 60.0, clock=clock, on_change=sizes.append, on_evict=lambda r, n: evictions.append((r, n))
    )
    a, b, c = (store.create(state(i)) for i in range(3))
    clock.now += 1
    store.get(a)  # a is now the most recently used
    d = store.create(state(3))
    assert len(store) == 3 and set(store.ids()) == {a, c, d}
    with pytest.raises(UnknownSession):
        store.get(b)
    assert evictions == [("cap", 1)] and sizes[-1] == 3
    assert len({a, b, c, d}) == 4 and all(0 < i < 2**31 for i in (a, b, c, d))


def test_sessions_expire_after_idle_ttl() -> None:
    clock = Clock()
    store = CompatSessions(10, 60.0, clock=clock)
    old = store.create(state(1))
    clock.now += 30
    fresh = store.create(state(2))
    clock.now += 31  # old idle for 61 s, fresh for 31 s
    with pytest.raises(UnknownSession):
        store.get(old)
    assert store.get(fresh) == state(2)
    clock.now += 59
    store.put(fresh, state(3))  # using it keeps it alive
    clock.now += 59
    assert store.get(fresh) == state(3)
    clock.now += 61
    assert store.sweep() == 1 and len(store) == 0


def test_sessions_close() -> None:
    store = CompatSessions(10, 60.0)
    env_idx = store.create(state(1))
    assert store.close(env_idx) is True and store.close(env_idx) is False
    with pytest.raises(UnknownSession):
        store.put(env_idx, state(2))
    assert "call /create" in str(UnknownSession(env_idx))


def test_small_states_travel_uncompressed_and_long_ones_compressed() -> None:
    from agent_envs.api.tokens import COMPRESS_ABOVE, _b64decode

    codec = token_codec(b"k" * 32, FINGERPRINT)
    small = EpisodeState(goal_set="synthetic", goal=1, query="red shoes", steps=3)
    long = EpisodeState(goal_set="synthetic", goal=1, query="red shoes " * 200, steps=3)
    for state, compressed in ((small, False), (long, True)):
        token = codec.encode(state)
        version, payload, _ = token.split(".")
        raw = _b64decode(payload)
        assert version == "v2" and (raw[:1] != b"{") is compressed
        assert (
            len(orjson.dumps({"f": FINGERPRINT[:12], "d": state.to_dict()})) > COMPRESS_ABOVE
        ) is compressed
        assert codec.decode(token) == state


def test_version_1_tokens_from_before_an_upgrade_still_decode() -> None:
    """v1 payloads are always zlib: an episode started on a replica of the previous release goes on."""
    codec = token_codec(b"k" * 32, FINGERPRINT)
    state = EpisodeState(goal_set="synthetic", goal=7, query="blue mug", options={"size": "large"}, steps=4)
    body = orjson.dumps({"f": FINGERPRINT[:12], "d": state.to_dict()})
    signed = "v1." + base64.urlsafe_b64encode(zlib.compress(body)).rstrip(b"=").decode()
    mac = base64.urlsafe_b64encode(codec._mac(signed.encode())).rstrip(b"=").decode()
    assert codec.decode(f"{signed}.{mac}") == state
    # a v1 token's payload is never read as plain JSON (it must inflate)
    plain = "v1." + base64.urlsafe_b64encode(body).rstrip(b"=").decode()
    mac = base64.urlsafe_b64encode(codec._mac(plain.encode())).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="malformed"):
        codec.decode(f"{plain}.{mac}")
