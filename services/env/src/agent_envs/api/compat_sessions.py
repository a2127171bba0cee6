"""Where AgentGym-compatible sessions live: ``env_idx`` -> episode state, and each one's last answer.

AgentGym's protocol is stateful (``/create`` hands out an id, later calls name it), so, unlike the native
protocol's, these sessions must be stored somewhere every worker of every replica can reach. Two stores share
one async interface (``SessionStore``):

- ``RedisSessionStore`` (the default topology: ``make up-local`` and compose set ``AGENTRL_REDIS_URL``): one
  Redis server shared by all replicas and workers, so any of them serves any session and a replica's death
  loses none. Each session is a Redis hash holding its signed state token (the same token as the native
  protocol's: a tampered store cannot forge an episode), its client's address, and the request key and answer
  of the request that made its current state.
- ``MemorySessionStore`` (over ``CompatSessions``): the sessions of ONE process. For a single replica with a
  single worker only (``agent-envs serve --workers 1`` without ``AGENTRL_REDIS_URL``: a demo or a test);
  with more processes a session is unknown to all but the one that created it.

Exactly once. A request that changes a session (``/create``, ``/reset``, ``/step``, ``/close``) may be sent
twice: the balancer re-sends it to another replica when the first one died or timed out, and a client may retry
with an ``Idempotency-Key``. Such a request carries a *request key* (``request_key``: the client's
``Idempotency-Key``, else the balancer's ``X-Request-Id``, which nginx keeps the same across its retries of one
request; bound to the request's content). The key and the answer are written in the same atomic step as the
session's new state, so exactly one attempt changes the session, and every other attempt with that key gets
the recorded answer (``AlreadyAnswered``) instead of applying the request again:

- ``get(..., key)`` raises ``AlreadyAnswered`` when the session's current state was made by this key (the first
  attempt committed, then its answer was lost with its replica);
- ``put`` is a compare-and-set on the state the request started from; when it loses because an attempt with the
  same key committed first, it raises ``AlreadyAnswered`` too (else ``SessionConflict``: another request);
- ``create`` and ``close`` record their answer under the key for ``RETRY_WINDOW_S`` (the session id does not
  exist before a create, nor after a close), so a retried create makes no second session and a retried close
  answers what the first did.

Only the last answer per session is kept: a client sends a session's requests one after another, so the
balancer's retries of a request always come before the client's next one.

One store call per step: the balancer sends a session's requests to one replica, so ``RedisSessionStore`` keeps
a copy of each session it wrote and a change can start from it (``get(..., cached=True)``); the change's
compare-and-set tells when another process changed the session meanwhile, and the caller then reads the store
and computes again. Copies that keep turning out stale (a session's requests spread over several processes) are
left alone.

Policy (both stores):

- ids are random positive 31-bit integers (the original's are random too), never reused while live;
- no idle expiry by default (``AGENTRL_COMPAT_IDLE_TTL_S`` 0): AgentGym's own servers keep a session until it is
  closed, and its clients create theirs once and reuse them for every later episode, so a session idle for a
  checkpoint save or an evaluation round must still be there. A positive TTL expires idle sessions;
- memory is bounded by a cap instead: at ``max_sessions`` live sessions, ``/create`` evicts the session idle
  the longest (the least recently used), logs it (its id, client and idle time) and counts it
  (``webshop_compat_evictions_total{reason="cap"}``);
- Redis: each client (the address nginx saw, from ``X-Forwarded-For``; else the peer address) holds at most
  ``client_quota`` sessions: its own least recently used one is evicted first (``reason="client_quota"``), so
  one client's flood of ``/create`` cannot push another's sessions out before the cap;
- ``/close`` removes a session at once; an evicted or closed id is unknown (each environment answers that in
  its original's words);
- a step stores its new state only if the session still holds the state the step started from
  (compare-and-set), so two requests racing on one session cannot both apply their action.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import orjson

log = logging.getLogger("agent_envs.api")
_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+

MAX_ID = 2**31 - 1
MAX_REQUEST_KEY = 128  # characters of an Idempotency-Key or X-Request-Id header (nginx's $request_id is 32)
# How long the answer of a create or a close is kept for a retry: longer than the balancer's retry window
# (proxy_next_upstream_timeout: 8 s, SciWorld 90 s, each attempt within its read timeout).
RETRY_WINDOW_S = 300
# A replica's copies of sessions (RedisSessionStore.get): used while at most this share of them turn out stale,
# else tried once in COPY_PROBE_EVERY requests. A stale copy costs a computation and a store call more than no
# copy and a current one saves one store call, so copies pay below one stale in two; a margin for the computation.
STALE_COPIES_AT_MOST = 0.3
COPY_PROBE_EVERY = 32
# A write (create, step, close) that the store runs later than its sender's deadline less this margin is not
# applied (the scripts' last argument): a replica that gave up on a hung store has answered 503
# session_store_down, and the write it had sent must not take effect when the store wakes up. The margin is for
# the answer's way back to the replica (an answer slower than that still makes a 503 whose write was applied).
WRITE_MARGIN_S = 0.5
# How often a replica measures the offset between its clock and the store's (one TIME call): the deadline is on
# the store's clock, so hosts whose clocks disagree still agree on it.
CLOCK_REFRESH_S = 60.0
# A TIME call slower than this measured the offset with too much error (half its round trip): measure again.
CLOCK_MAX_RTT_S = 0.1


class UnknownSession(KeyError):
    """No live session with this id (closed, evicted, expired; or in another process's memory store)."""

    def __init__(self, env_idx: int) -> None:
        super().__init__(env_idx)
        self.env_idx = env_idx

    def __str__(self) -> str:
        return (
            f"env_idx {self.env_idx} is not a live session: it was closed, or evicted when the store was full "
            "(AGENTRL_COMPAT_MAX_SESSIONS; or, with the single-process memory store, it was created by another "
            "process: set AGENTRL_REDIS_URL to share sessions); call /create"
        )


class SessionConflict(Exception):
    """The session changed between this request's read and its write (a concurrent request)."""


class SessionStoreUnavailable(Exception):
    """The shared store did not answer (Redis down, unreachable or out of memory)."""


class IdTaken(Exception):
    """``create`` drew an id that is live already: draw another (one chance in millions)."""


class Answer(NamedTuple):
    """An answer as it was sent (status and JSON body), recorded with the state change it reports."""

    status: int
    body: bytes

    def pack(self) -> str:
        return f"{self.status} {self.body.decode()}"

    @classmethod
    def unpack(cls, text: str) -> Answer:
        status, _, body = text.partition(" ")
        return cls(int(status), body.encode())


class AlreadyAnswered(Exception):
    """This request (by its request key) was applied already: send ``answer``, apply nothing."""

    def __init__(self, answer: Answer) -> None:
        super().__init__("a retry of a request that was applied already")
        self.answer = answer


class Version(NamedTuple):
    """What ``put`` compares against (compare-and-set); ``cached``: the state came from this process's copy of
    the session (``RedisSessionStore``'s cache), which may be stale: a ``put`` then fails and the caller reads
    the store and computes again."""

    value: object
    cached: bool = False


def request_key(header: str | None, path: str, fields: Mapping[str, Any]) -> str | None:
    """The key that makes a state-changing request exactly-once: ``header`` (the client's ``Idempotency-Key``,
    else the balancer's ``X-Request-Id``) and a digest of the request's path and fields.

    The digest makes a key count only for the request it came with: a client that reuses an id for different
    requests gets each one applied, and only a true re-send (same id, same request) gets the recorded answer.
    """
    if not header:
        return None
    content = orjson.dumps({"p": path, "f": dict(fields)}, option=orjson.OPT_SORT_KEYS)
    return f"{header[:MAX_REQUEST_KEY]}:{hashlib.blake2b(content, digest_size=8).hexdigest()}"


@dataclass
class _Entry:
    state: Any
    last_used: float
    key: str | None = None  # the request key of the write that made ``state``
    answer: Answer | None = None  # and that request's answer


class CompatSessions:
    """LRU-ordered map of live sessions with a cap and an optional idle TTL (see the module docstring)."""

    def __init__(
        self,
        max_sessions: int,
        idle_ttl_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[int], None] | None = None,
        on_evict: Callable[[str, int], None] | None = None,
        name: str = "sessions",
    ) -> None:
        """``idle_ttl_s`` 0: sessions never expire by age (only the cap evicts); ``name``: the environment's id in
        the log."""
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.name = name
        self._clock = clock
        self._on_change = on_change
        self._on_evict = on_evict
        self._sessions: OrderedDict[int, _Entry] = OrderedDict()  # oldest use first
        self._answers: OrderedDict[str, tuple[Answer, float]] = OrderedDict()  # creates and closes, by key
        self._lock = threading.Lock()
        self._random = random.SystemRandom()

    def __len__(self) -> int:
        return len(self._sessions)

    def new_id(self) -> int:
        while True:
            env_idx = self._random.randint(1, MAX_ID)
            if env_idx not in self._sessions:
                return env_idx

    def create(
        self,
        state: Any,
        env_idx: int | None = None,
        key: str | None = None,
        answer: Answer | None = None,
    ) -> int:
        """A new session holding ``state`` (under ``env_idx``, or a new id); raises ``AlreadyAnswered`` for a
        retried create (``key``), ``IdTaken`` when ``env_idx`` is live."""
        evicted: list[tuple[int, float]] = []
        with self._lock:
            now = self._clock()
            recorded = self._recorded(key, now)
            if recorded is not None:
                raise AlreadyAnswered(recorded)
            self._expire(now)
            if env_idx is None:
                env_idx = self.new_id()
            elif env_idx in self._sessions:
                raise IdTaken(env_idx)
            while len(self._sessions) >= self.max_sessions:
                victim, entry = self._sessions.popitem(last=False)
                evicted.append((victim, now - entry.last_used))
            self._sessions[env_idx] = _Entry(state, now, key, answer)
            if key is not None and answer is not None:
                self._record(key, answer, now)
            size = len(self._sessions)
        for victim, idle_s in evicted:
            log_eviction(self.name, "cap", victim, None, idle_s)
        if evicted and self._on_evict is not None:
            self._on_evict("cap", len(evicted))
        self._changed(size)
        return env_idx

    def get(self, env_idx: int, key: str | None = None, touch: bool = True) -> Any:
        """The session's state (``touch``: marks it used); raises ``UnknownSession``, or ``AlreadyAnswered``
        when its state was made by the request ``key`` (or the key closed it)."""
        with self._lock:
            now = self._clock()
            entry = self._sessions.get(env_idx)
            expired = entry is not None and self._idle(entry, now)
            if entry is None or expired:
                if expired:
                    del self._sessions[env_idx]
                size = len(self._sessions)
                recorded = self._recorded(key, now)
            else:
                if key is not None and entry.key == key and entry.answer is not None:
                    raise AlreadyAnswered(entry.answer)
                if touch:
                    entry.last_used = now
                    self._sessions.move_to_end(env_idx)
                return entry.state
        if expired:
            if self._on_evict is not None:
                self._on_evict("ttl", 1)
            self._changed(size)
        if recorded is not None:
            raise AlreadyAnswered(recorded)
        raise UnknownSession(env_idx)

    def put(
        self,
        env_idx: int,
        state: Any,
        expected: Any = None,
        key: str | None = None,
        answer: Answer | None = None,
        check: bool = False,
    ) -> None:
        """Store the session's new state (``check``: only if it still holds ``expected``, by identity);
        raises ``UnknownSession`` if it went away meanwhile, ``AlreadyAnswered`` or ``SessionConflict``."""
        with self._lock:
            entry = self._sessions.get(env_idx)
            if entry is None:
                raise UnknownSession(env_idx)
            if check and entry.state is not expected:
                if key is not None and entry.key == key and entry.answer is not None:
                    raise AlreadyAnswered(entry.answer)
                raise SessionConflict(_conflict(env_idx))
            entry.state, entry.last_used, entry.key, entry.answer = state, self._clock(), key, answer
            self._sessions.move_to_end(env_idx)

    def close(self, env_idx: int, key: str | None = None, answer: Answer | None = None) -> bool:
        """Remove the session: whether it was live; raises ``AlreadyAnswered`` for a retried close."""
        with self._lock:
            now = self._clock()
            recorded = self._recorded(key, now)
            if recorded is not None:
                raise AlreadyAnswered(recorded)
            found = self._sessions.pop(env_idx, None) is not None
            if found and key is not None and answer is not None:
                self._record(key, answer, now)
            size = len(self._sessions)
        if found:
            self._changed(size)
        return found

    def ids(self) -> list[int]:
        with self._lock:
            return list(self._sessions)

    def sweep(self) -> int:
        """Drop every expired session; returns how many."""
        with self._lock:
            dropped = self._expire(self._clock())
            size = len(self._sessions)
        if dropped:
            self._changed(size)
        return dropped

    def _idle(self, entry: _Entry, now: float) -> bool:
        return self.idle_ttl_s > 0 and now - entry.last_used > self.idle_ttl_s

    def _expire(self, now: float) -> int:
        """Drop expired sessions from the LRU end, and old recorded answers (the lock is held)."""
        while self._answers and next(iter(self._answers.values()))[1] < now:
            self._answers.popitem(last=False)
        dropped = 0
        while self._sessions:
            env_idx, entry = next(iter(self._sessions.items()))
            if not self._idle(entry, now):
                break
            del self._sessions[env_idx]
            dropped += 1
        if dropped and self._on_evict is not None:
            self._on_evict("ttl", dropped)
        return dropped

    def _record(self, key: str, answer: Answer, now: float) -> None:
        self._answers[key] = (answer, now + RETRY_WINDOW_S)
        while len(self._answers) > self.max_sessions:  # bounded even under a flood of creates
            self._answers.popitem(last=False)

    def _recorded(self, key: str | None, now: float) -> Answer | None:
        if key is None:
            return None
        found = self._answers.get(key)
        return found[0] if found is not None and found[1] >= now else None

    def _changed(self, size: int) -> None:
        if self._on_change is not None:
            self._on_change(size)


def log_eviction(name: str, reason: str, env_idx: int, client: str | None, idle_s: float) -> None:
    """One warning line per session evicted without /close: an operator sees who lost what, and why."""
    log.warning(
        "AgentGym session evicted",
        extra={"fields": {"env": name, "env_idx": env_idx, "reason": reason, "client": client,
                          "idle_s": round(idle_s, 1)}},
    )  # fmt: skip


# ---- the async interface the routes use ---------------------------------------------------------------------
class SessionStore(Protocol):
    """Async session store; ``version`` from ``get`` is what ``put`` compares against (compare-and-set).

    ``key`` is a request key (``request_key``) and ``answer`` what that request answers: with a key, ``create``,
    ``get``, ``put`` and ``close`` raise ``AlreadyAnswered`` for a request that was applied already."""

    shared: bool

    def new_id(self) -> int: ...
    async def create(
        self, env_idx: int, state: Any, client: str, key: str | None = None, answer: Answer | None = None
    ) -> None: ...
    async def get(
        self, env_idx: int, key: str | None = None, touch: bool = True, cached: bool = False
    ) -> tuple[Any, Version]: ...
    async def put(
        self, env_idx: int, state: Any, version: Version, key: str | None = None, answer: Answer | None = None
    ) -> None: ...
    async def close(self, env_idx: int, key: str | None = None, answer: Answer | None = None) -> bool: ...
    async def ids(self) -> list[int]: ...
    async def sweep(self) -> int: ...
    async def aclose(self) -> None: ...


class MemorySessionStore:
    """SINGLE-PROCESS store: the sessions of this one worker process (see the module docstring)."""

    shared = False

    def __init__(self, sessions: CompatSessions) -> None:
        self.sessions = sessions

    def new_id(self) -> int:
        return self.sessions.new_id()

    async def create(
        self, env_idx: int, state: Any, client: str, key: str | None = None, answer: Answer | None = None
    ) -> None:
        self.sessions.create(state, env_idx, key, answer)

    async def get(
        self, env_idx: int, key: str | None = None, touch: bool = True, cached: bool = False
    ) -> tuple[Any, Version]:
        state = self.sessions.get(env_idx, key, touch)
        return state, Version(state)

    async def put(
        self, env_idx: int, state: Any, version: Version, key: str | None = None, answer: Answer | None = None
    ) -> None:
        self.sessions.put(env_idx, state, version.value, key, answer, check=True)

    async def close(self, env_idx: int, key: str | None = None, answer: Answer | None = None) -> bool:
        return self.sessions.close(env_idx, key, answer)

    async def ids(self) -> list[int]:
        return self.sessions.ids()

    async def sweep(self) -> int:
        return self.sessions.sweep()

    async def aclose(self) -> None:
        return None


# Redis keys: PREFIX + "s:" + id (hash: t = token, c = client, r = the request key of the write that made t, a =
# that request's answer; '' for none), PREFIX + "all" (zset id -> last use, ms), PREFIX + "c:" + client (zset id ->
# last use, ms), PREFIX + "q:" + request key (the answer of a create or a close, for RETRY_WINDOW_S).
# Times come from Redis' own clock (replicas may disagree). A TTL of 0 means none: no key expires by age. The
# scripts that write take a deadline in that clock as their last argument, and change nothing after it (-3).
# The scripts touch keys they derive from arguments, which is fine on one Redis server (not Redis Cluster).
_NOW = "local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
_IN_TIME = "if now > tonumber(ARGV[#ARGV]) then return {-3} end\n"
_TOUCH = """
local function touch(prefix, id, client, key, ttl, now)
  redis.call('ZADD', prefix .. 'all', now, id)
  redis.call('ZADD', prefix .. 'c:' .. client, now, id)
  if ttl > 0 then
    redis.call('PEXPIRE', key, ttl)
    redis.call('PEXPIRE', prefix .. 'c:' .. client, ttl)
  end
end
"""
# -> {1, live, evictions...} | {2, recorded answer} | {-2} | {-3} late; evictions: reason, id, client, idle ms
_CREATE = (
    _NOW
    + _IN_TIME
    + _TOUCH
    + """
local prefix, id, token, client = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl, quota, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local rkey, answer, window = ARGV[8], ARGV[9], tonumber(ARGV[10])
local all, mine, key = prefix .. 'all', prefix .. 'c:' .. client, prefix .. 's:' .. id
if rkey ~= '' then
  local recorded = redis.call('GET', prefix .. 'q:' .. rkey)
  if recorded then return {2, recorded} end
end
if redis.call('EXISTS', key) == 1 then return {-2} end
if ttl > 0 then
  redis.call('ZREMRANGEBYSCORE', all, '-inf', now - ttl)
  redis.call('ZREMRANGEBYSCORE', mine, '-inf', now - ttl)
end
local out = {1, 0}
while redis.call('ZCARD', mine) >= quota do
  local oldest = redis.call('ZPOPMIN', mine)
  redis.call('DEL', prefix .. 's:' .. oldest[1])
  redis.call('ZREM', all, oldest[1])
  for _, v in ipairs({'client_quota', oldest[1], client, now - tonumber(oldest[2])}) do table.insert(out, v) end
end
while redis.call('ZCARD', all) >= cap do
  local oldest = redis.call('ZPOPMIN', all)
  local victim = prefix .. 's:' .. oldest[1]
  local owner = redis.call('HGET', victim, 'c')
  redis.call('DEL', victim)
  if owner then redis.call('ZREM', prefix .. 'c:' .. owner, oldest[1]) end
  for _, v in ipairs({'cap', oldest[1], owner or '', now - tonumber(oldest[2])}) do table.insert(out, v) end
end
redis.call('HSET', key, 't', token, 'c', client, 'r', rkey, 'a', answer)
touch(prefix, id, client, key, ttl, now)
if rkey ~= '' then redis.call('SET', prefix .. 'q:' .. rkey, answer, 'PX', window) end
out[2] = redis.call('ZCARD', all)
return out
"""
)
# -> {1, token} | {2, recorded answer} | {0}
_GET = (
    _NOW
    + _TOUCH
    + """
local prefix, id, ttl, rkey, touching = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5] == '1'
local key = prefix .. 's:' .. id
local entry = redis.call('HMGET', key, 't', 'c', 'r', 'a')
if not entry[1] then
  if rkey ~= '' then
    local recorded = redis.call('GET', prefix .. 'q:' .. rkey)
    if recorded then return {2, recorded} end
  end
  return {0}
end
if rkey ~= '' and entry[3] == rkey then return {2, entry[4]} end
if touching then touch(prefix, id, entry[2], key, ttl, now) end
return {1, entry[1]}
"""
)
# -> {1} | {2, recorded answer} | {0} unknown | {-1} conflict | {-3} late
_PUT = (
    _NOW
    + _IN_TIME
    + _TOUCH
    + """
local prefix, id, expected, token, ttl, rkey, answer = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7]
local key = prefix .. 's:' .. id
local entry = redis.call('HMGET', key, 't', 'c', 'r', 'a')
if not entry[1] then return {0} end
if rkey ~= '' and entry[3] == rkey then return {2, entry[4]} end
if entry[1] ~= expected then return {-1} end
redis.call('HSET', key, 't', token, 'r', rkey, 'a', answer)
touch(prefix, id, entry[2], key, ttl, now)
return {1}
"""
)
# -> {1} closed | {0} unknown | {2, recorded answer} | {-3} late
_CLOSE = (
    _NOW
    + _IN_TIME
    + """
local prefix, id, rkey, answer, window = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if rkey ~= '' then
  local recorded = redis.call('GET', prefix .. 'q:' .. rkey)
  if recorded then return {2, recorded} end
end
local key = prefix .. 's:' .. id
local client = redis.call('HGET', key, 'c')
if not client then return {0} end
redis.call('DEL', key)
redis.call('ZREM', prefix .. 'all', id)
redis.call('ZREM', prefix .. 'c:' .. client, id)
if rkey ~= '' then redis.call('SET', prefix .. 'q:' .. rkey, answer, 'PX', window) end
return {1}
"""
)
_IDS = (
    _NOW
    + """
local ttl = tonumber(ARGV[2])
if ttl > 0 then return redis.call('ZRANGEBYSCORE', ARGV[1] .. 'all', now - ttl, '+inf') end
return redis.call('ZRANGE', ARGV[1] .. 'all', 0, -1)
"""
)


class RedisSessionStore:
    """Sessions in one Redis server shared by every replica and worker (see the module docstring).

    States are stored as signed tokens (``encode``/``decode``: the native protocol's ``TokenCodec``).
    """

    shared = True

    def __init__(
        self,
        url: str,
        encode: Callable[[Any], str],
        decode: Callable[[str], Any],
        max_sessions: int,
        client_quota: int,
        idle_ttl_s: float = 0.0,
        prefix: str = "sessions:",
        timeout_s: float = 2.0,
        on_change: Callable[[int], None] | None = None,
        on_evict: Callable[[str, int], None] | None = None,
        deadline_s: float = 1.5,
        name: str = "sessions",
        cache_size: int = 4096,
    ) -> None:
        """``deadline_s`` bounds one store call, its reconnections and retries included: a store that is down
        (restarting, crashed, its host unreachable) gets a 503 ``session_store_down`` within it, before nginx's
        2 s read timeout would turn the wait into the balancer's own, vaguer, error. ``idle_ttl_s`` 0: no idle
        expiry. ``cache_size``: sessions this process keeps a copy of (0: none; see ``get``)."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        if max_sessions < 1 or client_quota < 1:
            raise ValueError("max_sessions and client_quota must be at least 1")
        self.url = url
        self.name = name
        self._encode = encode
        self._decode = decode
        self.max_sessions = max_sessions
        self.client_quota = client_quota
        self._ttl_ms = max(0, int(idle_ttl_s * 1000))
        self._prefix = prefix
        self._on_change = on_change
        self._on_evict = on_evict
        self._random = random.SystemRandom()
        self._deadline_s = deadline_s
        # env_idx -> (token, state) as this process last read or wrote it, least recently used first
        self._cache: OrderedDict[int, tuple[str, Any]] = OrderedDict()
        self._cache_size = cache_size
        self._stale = 0.0  # the recent share of copies that were stale when a write checked them (see get)
        self._copies_offered = 0
        self._clock_offset_ms: float | None = None  # the store's clock less ours (see _write_deadline_ms)
        self._clock_measured = 0.0
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=min(timeout_s, deadline_s / 3),  # room for a retry within the deadline
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            health_check_interval=30,
            decode_responses=True,
        )
        self._scripts = {
            name: self._redis.register_script(source)
            for name, source in (
                ("create", _CREATE),
                ("get", _GET),
                ("put", _PUT),
                ("close", _CLOSE),
                ("ids", _IDS),
            )  # fmt: skip
        }

    async def _run(self, name: str, *args: object) -> Any:
        return await self._within_deadline(self._scripts[name](args=list(args)))

    async def _write(self, name: str, *args: object) -> Any:
        """A script that writes, with its deadline: not applied if the store runs it too late (``_IN_TIME``)."""
        result = await self._run(name, *args, await self._write_deadline_ms())
        if int(result[0]) == -3:
            raise SessionStoreUnavailable(
                f"the AgentGym session store (Redis at {_redact(self.url)}) ran a write after its deadline; it was "
                "not applied: retry shortly, the session is kept"
            )
        return result

    async def _write_deadline_ms(self) -> int:
        """When, on the store's clock, a write sent now stops applying: this replica's own deadline less
        WRITE_MARGIN_S (a third of the deadline at most). The offset between the clocks is measured by a TIME
        call every CLOCK_REFRESH_S; its error is up to half that call's round trip, so a measurement slower than
        CLOCK_MAX_RTT_S (a busy host or store) is used once and taken again on the next write."""
        if self._clock_offset_ms is None or time.monotonic() - self._clock_measured > CLOCK_REFRESH_S:
            asked = time.time()
            seconds, micros = await self._within_deadline(self._redis.time())
            answered = time.time()
            self._clock_offset_ms = seconds * 1000 + micros / 1000 - (asked + answered) * 500
            precise = answered - asked <= CLOCK_MAX_RTT_S
            self._clock_measured = time.monotonic() if precise else -math.inf
        sent = time.time()  # the write's own deadline starts now, after the measurement
        margin_s = min(WRITE_MARGIN_S, self._deadline_s / 3)
        return int(sent * 1000 + self._clock_offset_ms + (self._deadline_s - margin_s) * 1000)

    async def _within_deadline(self, call: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            if _timeout is None:  # Python 3.10
                return await asyncio.wait_for(call, self._deadline_s)
            async with _timeout(self._deadline_s):  # no task per call, unlike wait_for: a store call is hot
                return await call
        except (RedisError, asyncio.TimeoutError) as error:
            reason = (
                f"{type(error).__name__}: {error}" if str(error) else f"no answer within {self._deadline_s} s"
            )
            raise SessionStoreUnavailable(
                f"the AgentGym session store (Redis at {_redact(self.url)}) failed: {reason}; retry shortly, "
                "the session is kept"
            ) from None

    async def ping(self) -> None:
        from redis.exceptions import RedisError

        try:
            await self._redis.ping()
        except RedisError as error:
            raise SessionStoreUnavailable(
                f"the AgentGym session store (Redis at {_redact(self.url)}) does not answer: {error}"
            ) from None

    def new_id(self) -> int:
        return self._random.randint(1, MAX_ID)

    async def create(
        self, env_idx: int, state: Any, client: str, key: str | None = None, answer: Answer | None = None
    ) -> None:
        token = self._encode(state)
        result = await self._write(
            "create", self._prefix, env_idx, token, client, self._ttl_ms, self.client_quota,
            self.max_sessions, key or "", answer.pack() if answer else "", RETRY_WINDOW_S * 1000,
        )  # fmt: skip
        status = int(result[0])
        if status == 2:
            raise AlreadyAnswered(Answer.unpack(result[1]))
        if status == -2:
            raise IdTaken(env_idx)
        evictions = result[2:]
        counts: dict[str, int] = {}
        for at in range(0, len(evictions), 4):
            reason, victim, owner, idle_ms = evictions[at : at + 4]
            log_eviction(self.name, reason, int(victim), owner or None, int(idle_ms) / 1000)
            counts[reason] = counts.get(reason, 0) + 1
        if self._on_evict is not None:
            for reason, count in counts.items():
                self._on_evict(reason, count)
        if self._on_change is not None:
            self._on_change(int(result[1]))
        self._remember(env_idx, token, state)

    async def get(
        self, env_idx: int, key: str | None = None, touch: bool = True, cached: bool = False
    ) -> tuple[Any, Version]:
        """The session's state and version. ``cached``: from this process's copy when it has one, without asking
        the store (a request that changes the session, and whose ``put`` checks the version): the balancer sends a
        session's requests to one replica, so that copy is nearly always current, and a step then costs one store
        call instead of two. When another process changed the session meanwhile, the ``put`` fails and the
        caller asks again with ``cached=False`` (``routes_envs.compat_answer``).

        A copy pays only where a session's requests reach this same process: with several uvicorn workers behind
        one replica address they may not (the balancer picks the replica, not the worker), and a stale copy costs
        a computation and a store call more than no copy. So the copies are used while most of them turn out
        current (the running share of stale ones under ``STALE_COPIES_AT_MOST``), and otherwise only one request
        in ``COPY_PROBE_EVERY``, to notice when that changes."""
        if cached and self._cache_size and self._copies_pay():
            hit = self._cache.get(env_idx)
            if hit is not None:
                self._cache.move_to_end(env_idx)
                return hit[1], Version(hit[0], cached=True)
        result = await self._run("get", self._prefix, env_idx, self._ttl_ms, key or "", "1" if touch else "0")
        status = int(result[0])
        if status == 2:
            self._cache.pop(env_idx, None)
            raise AlreadyAnswered(Answer.unpack(result[1]))
        if status == 0:
            self._cache.pop(env_idx, None)
            raise UnknownSession(env_idx)
        token = result[1]
        state = self._decode(token)
        self._remember(env_idx, token, state)
        return state, Version(token)

    async def put(
        self, env_idx: int, state: Any, version: Version, key: str | None = None, answer: Answer | None = None
    ) -> None:
        token = self._encode(state)
        result = await self._write(
            "put", self._prefix, env_idx, version.value, token, self._ttl_ms, key or "",
            answer.pack() if answer else "",
        )  # fmt: skip
        status = int(result[0])
        if version.cached:  # a running share over about the last 32 copies used
            self._stale += ((status != 1) - self._stale) / 32
        if status != 1:
            self._cache.pop(env_idx, None)
        if status == 2:
            raise AlreadyAnswered(Answer.unpack(result[1]))
        if status == 0:
            raise UnknownSession(env_idx)
        if status == -1:
            raise SessionConflict(_conflict(env_idx))
        self._remember(env_idx, token, state)

    def _copies_pay(self) -> bool:
        self._copies_offered += 1
        return self._stale <= STALE_COPIES_AT_MOST or self._copies_offered % COPY_PROBE_EVERY == 0

    def _remember(self, env_idx: int, token: str, state: Any) -> None:
        if self._cache_size:
            self._cache[env_idx] = (token, state)
            self._cache.move_to_end(env_idx)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    async def close(self, env_idx: int, key: str | None = None, answer: Answer | None = None) -> bool:
        self._cache.pop(env_idx, None)
        result = await self._write(
            "close", self._prefix, env_idx, key or "", answer.pack() if answer else "", RETRY_WINDOW_S * 1000
        )
        if int(result[0]) == 2:
            raise AlreadyAnswered(Answer.unpack(result[1]))
        return int(result[0]) == 1

    async def ids(self) -> list[int]:
        return [int(value) for value in await self._run("ids", self._prefix, self._ttl_ms)]

    async def sweep(self) -> int:
        return 0  # Redis expires sessions itself when a TTL is set; /create trims the indexes

    async def aclose(self) -> None:
        await self._redis.aclose()


def session_store(
    settings: Any,
    encode: Callable[[Any], str],
    decode: Callable[[str], Any],
    on_change: Callable[[int], None] | None,
    on_evict: Callable[[str, int], None],
    *,
    name: str,
    prefix: str,
) -> SessionStore:
    """Redis when ``AGENTRL_REDIS_URL`` is set (any worker of any replica serves any session), else the
    single-process memory store (one replica with one worker). ``settings``: the service's ``Settings``; ``name``:
    the environment's id (in the log); ``prefix``: its keys in the store."""
    if settings.redis_url:
        return RedisSessionStore(
            settings.redis_url, encode, decode, settings.compat_max_sessions, settings.compat_client_max_sessions,
            settings.compat_idle_ttl_s, prefix=prefix, on_change=on_change, on_evict=on_evict, name=name,
        )  # fmt: skip
    return MemorySessionStore(
        CompatSessions(
            settings.compat_max_sessions, settings.compat_idle_ttl_s, on_change=on_change, on_evict=on_evict,
            name=name,
        )
    )  # fmt: skip


def _redact(url: str) -> str:
    """The URL without a password."""
    head, at, tail = url.rpartition("@")
    return (head.split("//", 1)[0] + "//***@" + tail) if at else url


def _conflict(env_idx: int) -> str:
    return (
        f"env_idx {env_idx} changed while this request ran (a concurrent request on the same session applied "
        "its action first); GET /observation for the current page and continue"
    )
