"""The AgentGym-compatible sessions of one worker process: ``env_idx`` -> episode state.

AgentGym's protocol is stateful (``/create`` hands out an id, later calls name it), so these sessions, unlike
the native protocol's, live in the process that created them. Each holds only its ``EpisodeState`` (a few
hundred bytes), never a copy of the catalog.

Policy:

- ids are random positive 31-bit integers (the original's are random too), never reused while live;
- a session idle for longer than ``idle_ttl_s`` expires (checked on access, on ``/create`` and by a periodic
  sweep);
- at ``max_sessions`` live sessions, ``/create`` evicts the least recently used one (the oldest idle) to
  make room, so creation never fails and memory stays bounded;
- ``/close`` removes a session at once; an expired, evicted or closed id answers 404 ``unknown_env``.

Thread-safe (one lock), although the async handlers run on one event-loop thread anyway.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from ..core.env import EpisodeState

MAX_ID = 2**31 - 1


class UnknownSession(KeyError):
    """No live session with this id in this process."""

    def __init__(self, env_idx: int) -> None:
        super().__init__(env_idx)
        self.env_idx = env_idx

    def __str__(self) -> str:
        return (
            f"env_idx {self.env_idx} is not a live session here: it was closed, expired after the idle TTL, "
            "evicted at the session cap, or created by another replica/worker process (AgentGym sessions "
            "live in one process: point the client at one replica running one worker); call /create"
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
