"""Where AgentGym-compatible sessions live: ``env_idx`` -> episode state.

AgentGym's protocol is stateful (``/create`` hands out an id, later calls name it), so, unlike the native
protocol's, these sessions must be stored somewhere every worker of every replica can reach. Two stores share
one async interface (``SessionStore``):

- ``RedisSessionStore`` (the default topology: ``make up-local`` and compose set ``WEBSHOP_REDIS_URL``): one
  Redis server shared by all replicas and workers, so any of them serves any session and a replica's death
  loses none. Each session is a Redis hash holding its signed state token (the same token as the native
  protocol's: a tampered store cannot forge an episode) and its client's address.
- ``MemorySessionStore`` (over ``CompatSessions``): the sessions of ONE process. For a single replica with a
  single worker only (``webshop-env serve --workers 1`` without ``WEBSHOP_REDIS_URL``: a demo or a test);
  with more processes a session is unknown to all but the one that created it.

Policy (both stores):

- ids are random positive 31-bit integers (the original's are random too), never reused while live;
- a session idle for longer than the idle TTL expires;
- ``/close`` removes a session at once; an expired, evicted or closed id answers 404 ``unknown_env``;
- Redis: each client (the address nginx saw, from ``X-Forwarded-For``; else the peer address) holds at most
  ``client_quota`` sessions: its own least recently used one is evicted to make room, so one client can never
  evict another's sessions; all clients together hold at most ``max_sessions``, beyond which ``/create``
  answers 429 ``too_many_sessions`` (Redis' own ``maxmemory`` is the last bound, with no eviction policy);
- a step stores its new state only if the session still holds the state the step started from
  (compare-and-set), so two requests racing on one session cannot both apply their action;
- a step may carry the client's idempotency key (``Idempotency-Key``); the key of the step that made the
  current state is kept with it, so a step retried with the same key (after a timeout, a 503, a lost answer)
  is answered from that state instead of applying its action a second time.
- Memory: at ``max_sessions`` live sessions, ``/create`` evicts the least recently used one.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from ..core.env import EpisodeState

MAX_ID = 2**31 - 1


class UnknownSession(KeyError):
    """No live session with this id (closed, expired, evicted; or in another process's memory store)."""

    def __init__(self, env_idx: int) -> None:
        super().__init__(env_idx)
        self.env_idx = env_idx

    def __str__(self) -> str:
        return (
            f"env_idx {self.env_idx} is not a live session: it was closed, expired after the idle TTL or was "
            "evicted at the session cap (or, with the single-process memory store, was created by another "
            "process: set WEBSHOP_REDIS_URL to share sessions); call /create"
        )


class CompatSessions:
    """LRU-ordered map of live sessions with a cap and an idle TTL (see the module docstring)."""

    def __init__(
        self,
        max_sessions: int,
        idle_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[int], None] | None = None,
        on_evict: Callable[[str, int], None] | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self._clock = clock
        self._on_change = on_change
        self._on_evict = on_evict
        self._sessions: OrderedDict[int, tuple[EpisodeState, float]] = OrderedDict()  # oldest use first
        self._lock = threading.Lock()
        self._random = random.SystemRandom()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, state: EpisodeState) -> int:
        with self._lock:
            now = self._clock()
            self._expire(now)
            evicted = 0
            while len(self._sessions) >= self.max_sessions:
                self._sessions.popitem(last=False)
                evicted += 1
            while True:
                env_idx = self._random.randint(1, MAX_ID)
                if env_idx not in self._sessions:
                    break
            self._sessions[env_idx] = (state, now)
            size = len(self._sessions)
        if evicted and self._on_evict is not None:
            self._on_evict("cap", evicted)
        self._changed(size)
        return env_idx

    def get(self, env_idx: int) -> EpisodeState:
        """The session's state (marks it used); raises ``UnknownSession``."""
        with self._lock:
            now = self._clock()
            entry = self._sessions.get(env_idx)
            expired = entry is not None and now - entry[1] > self.idle_ttl_s
            if entry is None or expired:
                if expired:
                    del self._sessions[env_idx]
                size = len(self._sessions)
            else:
                self._sessions[env_idx] = (entry[0], now)
                self._sessions.move_to_end(env_idx)
                return entry[0]
        if expired:
            if self._on_evict is not None:
                self._on_evict("ttl", 1)
            self._changed(size)
        raise UnknownSession(env_idx)

    def put(self, env_idx: int, state: EpisodeState) -> None:
        """Store the session's new state; raises ``UnknownSession`` if it went away meanwhile."""
        with self._lock:
            if env_idx not in self._sessions:
                raise UnknownSession(env_idx)
            self._sessions[env_idx] = (state, self._clock())
            self._sessions.move_to_end(env_idx)

    def close(self, env_idx: int) -> bool:
        with self._lock:
            found = self._sessions.pop(env_idx, None) is not None
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

    def _expire(self, now: float) -> int:
        """Drop expired sessions from the LRU end (the lock is held)."""
        dropped = 0
        while self._sessions:
            env_idx, (_, last_used) = next(iter(self._sessions.items()))
            if now - last_used <= self.idle_ttl_s:
                break
            del self._sessions[env_idx]
            dropped += 1
        if dropped and self._on_evict is not None:
            self._on_evict("ttl", dropped)
        return dropped

    def _changed(self, size: int) -> None:
        if self._on_change is not None:
            self._on_change(size)


# ---- the async interface the routes use ---------------------------------------------------------------------
class SessionConflict(Exception):
    """The session changed between this request's read and its write (a concurrent or a retried request)."""


class SessionStoreFull(Exception):
    """All clients together hold ``max_sessions`` live sessions."""


class SessionStoreUnavailable(Exception):
    """The shared store did not answer (Redis down, unreachable or out of memory)."""


class Version(NamedTuple):
    """What ``put`` compares against (compare-and-set), and the idempotency key of the write that made it."""

    value: object
    key: str | None = None


class SessionStore(Protocol):
    """Async session store; ``version`` from ``get`` is what ``put`` compares against (compare-and-set)."""

    shared: bool

    async def create(self, state: EpisodeState, client: str) -> int: ...
    async def get(self, env_idx: int) -> tuple[EpisodeState, Version]: ...
    async def put(
        self, env_idx: int, state: EpisodeState, version: Version, key: str | None = None
    ) -> None: ...
    async def close(self, env_idx: int) -> bool: ...
    async def ids(self) -> list[int]: ...
    async def sweep(self) -> int: ...
    async def aclose(self) -> None: ...


class MemorySessionStore:
    """SINGLE-PROCESS store: the sessions of this one worker process (see the module docstring)."""

    shared = False

    def __init__(self, sessions: CompatSessions) -> None:
        self.sessions = sessions
        # env_idx -> (the state its last keyed write made, that key)
        self._keys: dict[int, tuple[EpisodeState, str]] = {}

    async def create(self, state: EpisodeState, client: str) -> int:
        return self.sessions.create(state)

    async def get(self, env_idx: int) -> tuple[EpisodeState, Version]:
        state = self.sessions.get(env_idx)
        made, key = self._keys.get(env_idx, (None, None))
        return state, Version(state, key if made is state else None)

    async def put(self, env_idx: int, state: EpisodeState, version: Version, key: str | None = None) -> None:
        if self.sessions.get(env_idx) is not version.value:
            raise SessionConflict(_conflict(env_idx))
        self.sessions.put(env_idx, state)
        self._keys.pop(env_idx, None)
        if key is not None:
            if len(self._keys) >= 2 * self.sessions.max_sessions:  # drop the keys of sessions gone meanwhile
                live = set(self.sessions.ids())
                self._keys = {idx: entry for idx, entry in self._keys.items() if idx in live}
            self._keys[env_idx] = (state, key)

    async def close(self, env_idx: int) -> bool:
        self._keys.pop(env_idx, None)
        return self.sessions.close(env_idx)

    async def ids(self) -> list[int]:
        return self.sessions.ids()

    async def sweep(self) -> int:
        return self.sessions.sweep()

    async def aclose(self) -> None:
        return None


# Redis keys: PREFIX + "s:" + id (hash: t = token, c = client, k = the idempotency key of the write that made t;
# '' for none), PREFIX + "all" (zset id -> last use, ms), PREFIX + "c:" + client (zset id -> last use, ms).
# Times come from Redis' own clock (replicas may disagree).
# The scripts touch keys they derive from arguments, which is fine on one Redis server (not Redis Cluster).
_NOW = "local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
_CREATE = (
    _NOW
    + """
local prefix, id, token, client = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ttl, quota, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local all, mine, key = prefix .. 'all', prefix .. 'c:' .. client, prefix .. 's:' .. id
if redis.call('EXISTS', key) == 1 then return {-2, 0, 0} end
redis.call('ZREMRANGEBYSCORE', all, '-inf', now - ttl)
redis.call('ZREMRANGEBYSCORE', mine, '-inf', now - ttl)
local evicted = 0
while redis.call('ZCARD', mine) >= quota do
  local oldest = redis.call('ZPOPMIN', mine)
  redis.call('DEL', prefix .. 's:' .. oldest[1])
  redis.call('ZREM', all, oldest[1])
  evicted = evicted + 1
end
local live = redis.call('ZCARD', all)
if live >= cap then return {-1, evicted, live} end
redis.call('HSET', key, 't', token, 'c', client)
redis.call('PEXPIRE', key, ttl)
redis.call('ZADD', all, now, id)
redis.call('ZADD', mine, now, id)
redis.call('PEXPIRE', mine, ttl)
return {1, evicted, live + 1}
"""
)
_GET = (
    _NOW
    + """
local prefix, id, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local key = prefix .. 's:' .. id
local entry = redis.call('HMGET', key, 't', 'c', 'k')
if not entry[1] then return false end
redis.call('PEXPIRE', key, ttl)
redis.call('ZADD', prefix .. 'all', now, id)
redis.call('ZADD', prefix .. 'c:' .. entry[2], now, id)
redis.call('PEXPIRE', prefix .. 'c:' .. entry[2], ttl)
return {entry[1], entry[3] or ''}
"""
)
_PUT = """
local key = ARGV[1] .. 's:' .. ARGV[2]
local current = redis.call('HGET', key, 't')
if not current then return 0 end
if current == ARGV[4] then return 1 end
if current ~= ARGV[3] then return -1 end
redis.call('HSET', key, 't', ARGV[4], 'k', ARGV[6])
redis.call('PEXPIRE', key, tonumber(ARGV[5]))
return 1
"""
_CLOSE = """
local key = ARGV[1] .. 's:' .. ARGV[2]
local client = redis.call('HGET', key, 'c')
if not client then return 0 end
redis.call('DEL', key)
redis.call('ZREM', ARGV[1] .. 'all', ARGV[2])
redis.call('ZREM', ARGV[1] .. 'c:' .. client, ARGV[2])
return 1
"""
_IDS = (
    _NOW
    + """
return redis.call('ZRANGEBYSCORE', ARGV[1] .. 'all', now - tonumber(ARGV[2]), '+inf')
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
        encode: Callable[[EpisodeState], str],
        decode: Callable[[str], EpisodeState],
        max_sessions: int,
        client_quota: int,
        idle_ttl_s: float,
        prefix: str = "webshop:compat:",
        timeout_s: float = 2.0,
        on_change: Callable[[int], None] | None = None,
        on_evict: Callable[[str, int], None] | None = None,
        deadline_s: float = 1.5,
    ) -> None:
        """``deadline_s`` bounds one store call, its reconnections and retries included: a store that is down
        (restarting, crashed, its host unreachable) gets a 503 ``session_store_down`` within it, before nginx's
        2 s read timeout would turn the wait into the balancer's own, vaguer, error."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        if max_sessions < 1 or client_quota < 1:
            raise ValueError("max_sessions and client_quota must be at least 1")
        self.url = url
        self._encode = encode
        self._decode = decode
        self.max_sessions = max_sessions
        self.client_quota = client_quota
        self._ttl_ms = max(1, int(idle_ttl_s * 1000))
        self._prefix = prefix
        self._on_change = on_change
        self._on_evict = on_evict
        self._random = random.SystemRandom()
        self._deadline_s = deadline_s
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
        from redis.exceptions import RedisError

        try:
            return await asyncio.wait_for(self._scripts[name](args=list(args)), self._deadline_s)
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

    async def create(self, state: EpisodeState, client: str) -> int:
        token = self._encode(state)
        while True:
            env_idx = self._random.randint(1, MAX_ID)
            status, evicted, live = await self._run(
                "create", self._prefix, env_idx, token, client, self._ttl_ms, self.client_quota,
                self.max_sessions,
            )  # fmt: skip
            if evicted and self._on_evict is not None:
                self._on_evict("client_quota", int(evicted))
            if status == -2:
                continue  # id collision: draw another
            if self._on_change is not None:
                self._on_change(int(live))
            if status == -1:
                raise SessionStoreFull(
                    f"the session store holds its maximum of {self.max_sessions} live AgentGym sessions "
                    "(WEBSHOP_COMPAT_MAX_SESSIONS); /close finished sessions, or retry after idle ones expire"
                )
            return env_idx

    async def get(self, env_idx: int) -> tuple[EpisodeState, Version]:
        found = await self._run("get", self._prefix, env_idx, self._ttl_ms)
        if found is None:
            raise UnknownSession(env_idx)
        token, key = found
        return self._decode(token), Version(token, key or None)

    async def put(self, env_idx: int, state: EpisodeState, version: Version, key: str | None = None) -> None:
        result = await self._run(
            "put", self._prefix, env_idx, version.value, self._encode(state), self._ttl_ms, key or ""
        )
        if result == 0:
            raise UnknownSession(env_idx)
        if result == -1:
            raise SessionConflict(_conflict(env_idx))

    async def close(self, env_idx: int) -> bool:
        return bool(await self._run("close", self._prefix, env_idx))

    async def ids(self) -> list[int]:
        return [int(value) for value in await self._run("ids", self._prefix, self._ttl_ms)]

    async def sweep(self) -> int:
        return 0  # Redis expires the sessions itself; /create trims the indexes

    async def aclose(self) -> None:
        await self._redis.aclose()


def _redact(url: str) -> str:
    """The URL without a password."""
    head, at, tail = url.rpartition("@")
    return (head.split("//", 1)[0] + "//***@" + tail) if at else url


def _conflict(env_idx: int) -> str:
    return (
        f"env_idx {env_idx} changed while this request ran (a concurrent or retried request on the same "
        "session applied its action first); GET /observation for the current page and continue"
    )
