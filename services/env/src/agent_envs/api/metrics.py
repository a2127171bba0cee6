"""Prometheus metrics and the middleware that records them (and writes the access log).

Metrics of the serving layer, for every environment it serves:

- ``agentrl_http_requests_total{method, route, status}`` and ``agentrl_http_request_duration_seconds{route}``
  (``route`` is the path template, e.g. ``/v1/goals/{goal}/expert``; ``unmatched`` for unknown paths);
- ``agentrl_errors_total{kind}``: error responses by kind (see ``api.errors``);
- ``agentrl_env_steps_total{env, api}``: environment steps served, by environment and API (``native``,
  ``compat``: AgentGym's, ``openenv``);
- ``agentrl_compat_evictions_total{reason}``: AgentGym (and OpenEnv) sessions dropped without their close.

WebShop's own: ``webshop_episodes_finished_total{api, outcome}`` (``purchase`` or ``truncated``) and
``webshop_compat_sessions`` (its live AgentGym sessions).

The names the serving layer's metrics had while WebShop was the one environment served
(``webshop_http_requests_total``, ``webshop_http_request_duration_seconds``, ``webshop_errors_total``,
``webshop_compat_evictions_total``, and the steps as ``webshop_env_steps_total{api}`` for WebShop and
``agentgym_env_steps_total{env, api}`` for the others) are exported too, with the same values, for one release
(:data:`OLD_NAMES`), so that a dashboard keeps working while it moves to the new names.

Several worker processes: ``agent-envs serve --workers N`` (N > 1) points ``PROMETHEUS_MULTIPROC_DIR`` at a
fresh directory before the workers start, and ``/metrics`` then aggregates every worker of the replica
(counters summed, the session gauge summed over live workers). With one worker, each process reports itself.
"""

from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prom_multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .errors import ASGIApp, Message, Receive, Scope, Send
from .logs import access_log

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def multiprocess_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


#: The serving layer's metrics by their names before they served every environment, exported as well for one
#: release (new name -> old name); ``agentrl_env_steps_total`` had two (see the module's docstring).
OLD_NAMES = {
    "agentrl_http_requests_total": "webshop_http_requests_total",
    "agentrl_http_request_duration_seconds": "webshop_http_request_duration_seconds",
    "agentrl_errors_total": "webshop_errors_total",
    "agentrl_compat_evictions_total": "webshop_compat_evictions_total",
    "agentrl_env_steps_total": "agentgym_env_steps_total",
}


class Both:
    """One labelled child of a metric and of its old name: what is counted in one is counted in the other."""

    __slots__ = ("new", "old")

    def __init__(self, new: Any, old: Any) -> None:
        self.new, self.old = new, old

    def inc(self, amount: float = 1.0) -> None:
        self.new.inc(amount)
        self.old.inc(amount)

    def observe(self, value: float) -> None:
        self.new.observe(value)
        self.old.observe(value)


class _Renamed:
    """A metric exported under its new name and its old one (:data:`OLD_NAMES`), with the same labels."""

    def __init__(
        self, kind: type, name: str, documentation: str, labelnames: list[str], **options: Any
    ) -> None:
        self.new = kind(name, documentation, labelnames, **options)
        self.old = kind(OLD_NAMES[name], f"{documentation} (old name of {name}: goes in the next release)",
                        labelnames, **options)  # fmt: skip
        # the pairs made so far: a step counts through here, and each labels() builds and locks (bounded, as the
        # request recorder's own cache; unmatched paths share one route template)
        self._children: dict[tuple[str, ...], Both] = {}

    def labels(self, *values: str) -> Both:
        both = self._children.get(values)
        if both is None:
            both = Both(self.new.labels(*values), self.old.labels(*values))
            if len(self._children) < 4096:
                self._children[values] = both
        return both


class Metrics:
    """The service's metrics, in a registry of their own (so that several apps can live in one process)."""

    def __init__(self) -> None:
        self.multiprocess = multiprocess_enabled()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = _Renamed(
            Counter, "agentrl_http_requests_total", "HTTP requests by route and status", ["method", "route", "status"],
            registry=r,
        )  # fmt: skip
        self.latency = _Renamed(
            Histogram, "agentrl_http_request_duration_seconds", "HTTP request latency", ["route"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.errors = _Renamed(
            Counter, "agentrl_errors_total", "Error responses by kind", ["kind"], registry=r
        )
        self.env_steps = _Renamed(
            Counter, "agentrl_env_steps_total", "Environment steps served, by environment and API", ["env", "api"],
            registry=r,
        )  # fmt: skip
        # WebShop's steps were counted under a name of their own (no env label): kept for one release
        self.old_webshop_steps = Counter(
            "webshop_env_steps_total", "WebShop's steps served (old name of agentrl_env_steps_total{env=\"webshop\"}: "
            "goes in the next release)", ["api"], registry=r,
        )  # fmt: skip
        self.finished = Counter(
            "webshop_episodes_finished_total", "Episodes ended by a purchase or truncation", ["api", "outcome"],
            registry=r,
        )  # fmt: skip
        self.compat_sessions = Gauge(
            "webshop_compat_sessions",
            "Live AgentGym-compatible sessions",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.compat_evictions = _Renamed(
            Counter,
            "agentrl_compat_evictions_total",
            "AgentGym sessions dropped without /close",
            ["reason"],
            registry=r,
        )

    def render(self) -> tuple[bytes, str]:
        if self.multiprocess:
            registry = CollectorRegistry()
            prom_multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def process_exit(self) -> None:
        """Drop this worker's live gauges from the shared directory (multiprocess mode)."""
        if self.multiprocess:
            prom_multiprocess.mark_process_dead(os.getpid())


class RequestRecorder:
    """Counts and times a finished request by route template and status, and writes its access-log line.

    Access log sampling: every error (status >= 400) and every request slower than ``log_slow_s`` gets a
    line; of the other requests one in ``log_every`` does (``AGENTRL_ACCESS_LOG_EVERY``, 1: all), with
    ``sampled: N`` on the line so counts can be scaled back. Why: a log line per step cost about a quarter of
    a step's server CPU; the metrics still count every request exactly. Shared by the middleware below and
    the step's fast path (``routes_native.StepFastPath``), which answers in front of it.
    """

    def __init__(
        self, metrics: Metrics, log_requests: bool = True, log_every: int = 1, log_slow_s: float = 0.0
    ) -> None:
        self.metrics = metrics
        self.log_requests = log_requests
        self.log_every = max(1, log_every)
        self.log_slow_s = log_slow_s
        self._unlogged = 0
        # labelled children by label values: ``labels()`` builds and locks on every call
        self._request_counters: dict[tuple[str, str, int], Any] = {}
        self._latency_histograms: dict[str, Any] = {}

    def record(self, method: str, template: str, status: int, elapsed: float, path: str) -> None:
        counter = self._request_counters.get((method, template, status))
        if counter is None:
            counter = self.metrics.requests.labels(method, template, str(status))
            if len(self._request_counters) < 4096:  # bounded: unmatched paths share one template
                self._request_counters[(method, template, status)] = counter
        counter.inc()
        histogram = self._latency_histograms.get(template)
        if histogram is None:
            histogram = self._latency_histograms[template] = self.metrics.latency.labels(template)
        histogram.observe(elapsed)
        if self.log_requests:
            self._log(method, path, status, elapsed)

    def _log(self, method: str, path: str, status: int, elapsed: float) -> None:
        sampled = status < 400 and elapsed < self.log_slow_s and self.log_every > 1
        if sampled:
            self._unlogged += 1
            if self._unlogged < self.log_every:
                return
            self._unlogged = 0
        fields: dict[str, Any] = {
            "method": method, "path": path, "status": status, "duration_ms": round(elapsed * 1000.0, 3),
        }  # fmt: skip
        if sampled:
            fields["sampled"] = self.log_every
        access_log.info("request", extra={"fields": fields})


class ObservabilityMiddleware:
    """Times every HTTP request through the app's middleware stack and records it (``RequestRecorder``)."""

    def __init__(self, app: ASGIApp, recorder: RequestRecorder) -> None:
        self.app = app
        self.recorder = recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            self.recorder.record(
                scope.get("method", ""), getattr(route, "path", None) or "unmatched", status,
                time.perf_counter() - started, scope.get("path", ""),
            )  # fmt: skip
