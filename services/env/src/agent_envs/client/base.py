"""What every client of the service shares: ``ServiceClient`` (pooled connections, retries, hedging, readiness)
and the client's errors.

One pooled ``httpx.AsyncClient`` per client object; share one client between all the episodes of a process.
Steps are pure functions of (state, action), so every call is retried on connection errors, timeouts and
5xx answers with exponential backoff and full jitter, for up to ``retry_budget`` seconds in all (default 60 s:
long enough to ride out a balancer or replica restart); 4xx answers are the caller's fault and raise at once.
A 503 that carries ``Retry-After`` (the service's "retry shortly": a limit reached, a store restarting) is not
retried sooner than it asks, up to ``max_retry_after`` seconds per wait. When the budget is spent the call raises
``ServiceUnavailable`` saying how long it tried and what failed last.

Timeouts are layered: the balancer gives a replica 2 s to answer and retries a hung one's request on
another replica; the client's per-attempt ``timeout`` (10 s) is longer than the balancer's whole retry
window for a step, so a slow replica costs a balancer retry, not a client one.

With other addresses of the service (``fallback_urls``: the other Ray nodes' Serve proxies) a slow but live
address is left too, not only a failing one: a reset or step that has no answer after ``hedge_after`` seconds
is sent once more to the next address (a hedged request; safe, since a native step is a pure function of
the state token it carries), the first answer wins, and when the other address won, later requests go there.
When the hedge did not help (every address is as slow: an overloaded service, not a slow link), hedging
pauses for ``primary_retry_s`` so as not to double the load.

The protocols are the subclasses': ``native.WebShopClient`` (WebShop's routes) and ``envs.EnvClient`` (the
contract's ``/<env>/v1`` routes of any environment).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable
from typing import Any, TypeVar

import httpx

from ..module_aliases import renamed_attributes
from .transport import LeanTransport

logger = logging.getLogger(__name__)
#: A request failing for this long starts warnings (one per client every ``WARN_EVERY_S``) while it retries.
WARN_AFTER_S = 5.0
WARN_EVERY_S = 15.0
#: A reset or step without an answer for this long is also sent to the next address, where there is one.
DEFAULT_HEDGE_AFTER_S = 2.0
_Client = TypeVar("_Client", bound="ServiceClient")


class ServiceError(Exception):
    """Base class of the client's errors (``WebShopError`` until this release: the old names still work, warned)."""


class ServiceUnavailable(ServiceError):
    """The server could not be reached, or kept failing (5xx), through every retry."""


class ServiceRequestError(ServiceError):
    """The server refused the request (4xx): retrying the same request would not help."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail


class ServiceClient:
    """The transport of every client of the service (see the module docstring); the protocol is a subclass's.

    Args:
        base_url: the balancer or a replica, e.g. ``http://127.0.0.1:36003``.
        timeout: seconds per attempt (connect, read, write and pool each).
        retries: at most this many attempts after the first (None: as many as ``retry_budget`` allows).
        retry_budget: seconds from the first attempt after which no new attempt starts (the last one may
            still take up to ``timeout``); 0 disables retries.
        backoff: base delay in seconds; attempt ``k`` sleeps ``uniform(0, min(max_backoff, backoff * 2**k))``.
        max_backoff: cap of one sleep.
        max_connections: connection pool size (at least the number of concurrent requests you make).
        transport: an httpx transport; default: ``LeanTransport`` for ``http://`` URLs (much cheaper per
            request than httpx's pool at high concurrency), httpx's own for ``https://``.
        fallback_urls: other addresses of the same service (e.g. the other Ray nodes' Serve proxies). A
            failed attempt moves the client to the next address; it goes back to ``base_url`` once
            ``primary_retry_s`` have passed. Steps are stateless, so any address serves any episode.
        primary_retry_s: seconds on a fallback address before ``base_url`` is tried again.
        max_retry_after: the longest wait a 503's ``Retry-After`` can impose on one retry (seconds); a server
            asking for more is retried after this long, still within ``retry_budget``.
        hedge_after: with ``fallback_urls``, seconds after which a reset or step still unanswered is also
            sent to the next address (the first answer wins; see the module's docstring); None: never.
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 10.0,
        retries: int | None = None,
        retry_budget: float = 60.0,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        max_connections: int = 512,
        transport: httpx.AsyncBaseTransport | None = None,
        fallback_urls: Iterable[str] = (),
        primary_retry_s: float = 30.0,
        max_retry_after: float = 10.0,
        hedge_after: float | None = DEFAULT_HEDGE_AFTER_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.urls = [self.base_url, *(u.rstrip("/") for u in fallback_urls if u.rstrip("/") != self.base_url)]
        self.primary_retry_s = primary_retry_s
        self._current = 0
        self._moved_at = 0.0
        if retry_budget < 0 or timeout <= 0:
            raise ValueError("retry_budget must be >= 0 and timeout > 0 (seconds)")
        if hedge_after is not None and not 0 < hedge_after < float("inf"):
            raise ValueError("hedge_after must be a positive number of seconds, or None")
        self.hedge_after = hedge_after
        self._hedge_paused_until = 0.0
        #: requests sent to a second address because the first was slow, and those the second answered first
        self.hedged = 0
        self.hedge_wins = 0
        self.retries = None if retries is None else max(0, retries)
        self.retry_budget = retry_budget
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._random = random.Random()
        self._warned_at = float("-inf")
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        if transport is None and self.base_url.startswith("http://"):
            transport = LeanTransport(max_connections=max_connections)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits, transport=transport)

    # ---- lifecycle -------------------------------------------------------------------------------------
    async def __aenter__(self: _Client) -> _Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ---- readiness ------------------------------------------------------------------------------------
    async def health(self) -> bool:
        """True when the server is ready (``/readyz`` answers 200); one attempt, never raises."""
        try:
            response = await self._http.get(self.url + "/readyz")
        except httpx.HTTPError:
            self._failed(self.url)
            return False
        return response.status_code == 200

    async def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.5) -> None:
        """Poll ``/readyz`` until it answers 200; raises ``ServiceUnavailable`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            url = self.url
            try:
                response = await self._http.get(url + "/readyz")
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code} from {url}"
            except httpx.HTTPError as error:
                last = f"{type(error).__name__} from {url}: {error}"
            self._failed(url)
            if time.monotonic() + interval > deadline:
                raise ServiceUnavailable(
                    f"{' / '.join(self.urls)} was not ready within {timeout:.0f} s (last: {last}); is the environment "
                    "service (or its balancer) running? `make up-local` starts one locally"
                )
            await asyncio.sleep(interval)

    # ---- transport -------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The address requests go to now: ``base_url``, or a fallback while ``base_url`` is failing."""
        if self._current and time.monotonic() - self._moved_at >= self.primary_retry_s:
            self._current = 0
        return self.urls[self._current]

    def _failed(self, url: str) -> None:
        """An attempt on ``url`` failed: later requests go to the next address (if there is another)."""
        if len(self.urls) > 1 and self.urls[self._current] == url:
            self._current = (self._current + 1) % len(self.urls)
            self._moved_at = time.monotonic()
            logger.info("env service: %s failed; moving to %s", url, self.urls[self._current])

    async def _request(self, method: str, path: str, hedge: bool = False, **kwargs: Any) -> Any:
        """One call with retries; ``hedge``: the request is idempotent and quick (a reset, a step), so a slow
        address may be raced against the next one."""
        attempt = 0
        started = time.monotonic()
        while True:
            url = self.url
            asked = 0.0  # what the server's Retry-After asks for, if it sent one
            try:
                if hedge and self._hedge_target(url) is not None:  # else no task, no timer: one request
                    response, url = await self._hedged(method, url, path, kwargs)
                else:
                    response = await self._http.request(method, url + path, **kwargs)
            except httpx.HTTPError as error:  # connection refused/reset, timeouts, protocol errors
                problem = f"{type(error).__name__}: {error}"
            else:
                if response.status_code < 400:
                    return response.json()
                if response.status_code < 500:
                    raise _request_error(response)
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code == 503:  # "unavailable, retry after": not sooner than it asks
                    asked = retry_after_seconds(response.headers.get("retry-after")) or 0.0
                    asked = min(asked, self.max_retry_after)
            self._failed(url)
            elapsed = time.monotonic() - started
            delay = self._random.uniform(0.0, min(self.max_backoff, self.backoff * 2 ** min(attempt, 30)))
            delay = max(delay, asked)
            if (self.retries is not None and attempt >= self.retries) or elapsed + delay > self.retry_budget:
                raise ServiceUnavailable(
                    f"{method} {url}{path} failed after {attempt + 1} attempt(s) in {elapsed:.1f} s "
                    f"(retry budget {self.retry_budget:g} s): {problem}. Is the environment service (or its "
                    "balancer) up? A longer retry_budget rides out longer restarts"
                )
            now = time.monotonic()
            if elapsed >= WARN_AFTER_S and now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                logger.warning(
                    "env service unreachable: %s %s%s has failed for %.0f s (%d attempts; last: %s); retrying for up "
                    "to %.0f s more (retry budget %g s)", method, url, path, elapsed, attempt + 1, problem,
                    self.retry_budget - elapsed, self.retry_budget,
                )  # fmt: skip
            await asyncio.sleep(delay)
            attempt += 1

    def _hedge_target(self, url: str) -> str | None:
        """The address a slow request on ``url`` is raced against; None when hedging is off or paused."""
        if self.hedge_after is None or len(self.urls) < 2 or time.monotonic() < self._hedge_paused_until:
            return None
        return self.urls[(self.urls.index(url) + 1) % len(self.urls)] if url in self.urls else None

    async def _hedged(
        self, method: str, url: str, path: str, kwargs: dict[str, Any]
    ) -> tuple[httpx.Response, str]:
        """The request on ``url``; still unanswered after ``hedge_after`` s, also on the next address. Returns
        the first good answer (below 500) and the address that gave it; raises or returns the last failure
        when both fail."""
        first = asyncio.ensure_future(self._http.request(method, url + path, **kwargs))
        tasks = {first: url}
        try:
            other = self._hedge_target(url)
            if other is not None:
                done, _ = await asyncio.wait({first}, timeout=self.hedge_after)
                other = None if done else self._hedge_target(url)
            if other is None:
                return await first, url
            self.hedged += 1
            tasks[asyncio.ensure_future(self._http.request(method, other + path, **kwargs))] = other
            pending = set(tasks)
            last: tuple[httpx.Response | BaseException, str] = (
                httpx.ConnectError("no attempt finished"),
                url,
            )
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    try:
                        last = (task.result(), tasks[task])
                    except httpx.HTTPError as error:
                        last = (error, tasks[task])
                        continue
                    response, where = last
                    if isinstance(response, httpx.Response) and response.status_code < 500:
                        if where == other:
                            self.hedge_wins += 1
                            logger.info("env service: %s answered before %s (no answer in %g s): moving to it",
                                        other, url, self.hedge_after)  # fmt: skip
                            self._failed(url)
                        else:  # the hedge did not help: every address is as slow; do not double the load
                            self._hedge_paused_until = time.monotonic() + self.primary_retry_s
                        return response, where
            outcome, where = last
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome, where
        finally:
            unfinished = [task for task in tasks if not task.done()]
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # retrieves every outcome: no stray warnings


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks the client to wait (delta-seconds or an HTTP date); None when
    absent or unreadable, 0 for a date already past."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value)) if value.replace(".", "", 1).isdigit() else _after_date(value, now)
    except (TypeError, ValueError, OverflowError):
        return None


def _after_date(value: str, now: float | None) -> float | None:
    from email.utils import parsedate_to_datetime

    when = parsedate_to_datetime(value)
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _request_error(response: httpx.Response) -> ServiceRequestError:
    try:
        data = response.json()
        return ServiceRequestError(response.status_code, str(data["error"]), str(data["detail"]))
    except Exception:
        return ServiceRequestError(response.status_code, "http_error", response.text[:500])


#: The errors' old names, for one release (with a deprecation warning), here and where they are re-exported.
OLD_ERROR_NAMES = {"WebShopError": "ServiceError", "WebShopUnavailable": "ServiceUnavailable",
                   "WebShopRequestError": "ServiceRequestError"}  # fmt: skip
ERRORS_RENAMED = "the errors of every environment's client, not WebShop's alone"
__getattr__ = renamed_attributes(__name__, OLD_ERROR_NAMES, ERRORS_RENAMED)
