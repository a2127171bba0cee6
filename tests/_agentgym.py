"""A client that speaks to the service exactly as AgentGym's WebShop client does (shared by the integration
and fault tests; the root conftest puts this folder on sys.path)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests


class AgentGymClient:
    """The HTTP behaviour of AgentGym's ``agentenv.envs.webshop.WebshopEnvClient``, call for call.

    ``/create`` once (bare int id); ``_post`` injects ``env_idx`` and tries 5 times, sleeping 0.1 s after a
    503 and retrying at once after any other non-200; ``_get`` sends ``?env_idx=``; ``reset`` posts
    ``session_id`` then replaces the observation with ``GET /observation``; ``close`` posts ``{}``.

    ``retry_budget_s > 0`` makes it the client a training run needs when the session store restarts: every
    request is retried on 502/503/504 and connection errors with capped exponential backoff and jitter for up to
    that many seconds, and each step carries an ``Idempotency-Key`` (the same for its retries), so a step whose
    answer was lost is answered again, never applied twice. ``retried`` counts the retries.

    One departure from AgentGym's client, in both modes: a 503 that carries ``Retry-After`` (the service's
    "retry shortly": ``session_store_down``, a limit reached) is retried after that many seconds (at most
    ``MAX_RETRY_AFTER_S`` a wait), for up to ``retry_after_budget_s`` from the first attempt, or the retry budget
    where that is longer; then its answer is returned as it is. A 503 without ``Retry-After`` is AgentGym's.
    """

    MAX_RETRY_AFTER_S = 5.0

    def __init__(
        self,
        env_server_base: str,
        timeout: int = 300,
        retry_budget_s: float = 0.0,
        retry_after_budget_s: float = 30.0,
    ) -> None:
        self.env_server_base = env_server_base
        self.timeout = timeout
        self.retry_budget_s = retry_budget_s
        self.retry_after_budget_s = retry_after_budget_s
        self.retried = 0
        self.http = requests.Session()
        ok = self._send("post", "create")
        if ok.status_code != 200:
            raise RuntimeError(f"Failed to create environment: {ok.status_code} {ok.text}")
        self.env_id = ok.json()

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One request, retried while the service says it is unavailable: after a 503's ``Retry-After`` (always),
        and with a retry budget on 502/503/504 and connection errors with backoff."""
        url = f"{self.env_server_base}/{path}"
        started, delay = time.monotonic(), 0.05
        deadline = started + self.retry_budget_s
        patience = started + max(self.retry_after_budget_s, self.retry_budget_s)
        while True:
            try:
                res = self.http.request(method, url, timeout=self.timeout, **kwargs)
            except requests.ConnectionError:
                if not self.retry_budget_s or time.monotonic() > deadline:
                    raise
                wait = delay * random.uniform(0.5, 1.0)
            else:
                asked = retry_after(res) if res.status_code == 503 else None
                if asked is not None:  # "retry shortly": wait what it asks (a little more, spread out)
                    wait = min(asked, self.MAX_RETRY_AFTER_S) * random.uniform(1.0, 1.2)
                    if time.monotonic() + wait > patience:
                        return res
                elif self.retry_budget_s and res.status_code in (502, 503, 504):
                    if time.monotonic() > deadline:
                        return res
                    wait = delay * random.uniform(0.5, 1.0)
                else:
                    return res
            self.retried += 1
            time.sleep(wait)
            delay = min(1.0, delay * 2)

    def _post(self, path: str, data: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        data["env_idx"] = self.env_id
        for _ in range(5):
            res = self._send("post", path, json=data, headers=headers)
            if res.status_code == 503:
                time.sleep(0.1)
            elif res.status_code == 200:
                break
        assert res.status_code == 200, f"{path}: {res.status_code} {res.text}"
        return res.json()

    def _get(self, path: str) -> Any:
        res = self._send("get", f"{path}?env_idx={self.env_id}")
        assert res.status_code == 200, f"{path}: {res.status_code} {res.text}"
        return res.json()

    def observe(self) -> str:
        return self._get("observation")

    def step(self, action: str) -> tuple[str, float, bool]:
        if action.endswith("</s>"):
            action = action[: -len("</s>")]
        key = {"Idempotency-Key": uuid.uuid4().hex} if self.retry_budget_s else None
        response = self._post("step", {"action": action}, key)
        return response["state"], response["reward"], response["done"]

    def reset(self, idx: int) -> list:
        response = self._post("reset", {"session_id": idx})
        response[0] = self.observe()
        return response

    def close(self) -> Any:
        return self._post("close", {})

    def probe(self) -> list[tuple[int, str | None, str | None]]:
        """(status, error, Retry-After) of one step and one observation, without retries: what the service
        says, e.g. while the session store is down (retry later, not "your session is gone")."""
        url, body = self.env_server_base, {"env_idx": self.env_id, "action": "search[probe]"}
        step = self.http.post(f"{url}/step", json=body, timeout=self.timeout)
        page = self.http.get(f"{url}/observation", params={"env_idx": self.env_id}, timeout=self.timeout)
        answers = [(r, r.json()) for r in (step, page)]
        return [(r.status_code, body.get("error") if isinstance(body, dict) else None, r.headers.get("retry-after"))
                for r, body in answers]  # fmt: skip


def retry_after(response: requests.Response) -> float | None:
    """The seconds of a response's ``Retry-After`` (delta-seconds; the service sends no dates), else None."""
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


Trace = list[tuple[str, float, bool]]  # (observation, reward, done) after reset and after each step


def episodes_across(
    url: str, plans: Mapping[int, Sequence[str]], disrupt: Callable[[], Any], gap_s: float = 0.3
) -> tuple[dict[int, Trace], int, Any]:
    """One AgentGym episode per goal at once (retrying clients), ``disrupt()`` run when every one of them is
    half-way through its actions: (traces, client retries, what ``disrupt`` returned).

    After the half-way point each client waits up to ``gap_s`` at random, then steps every ``gap_s`` (at least two
    steps are left, plans being 3 or more): a disruption begun ``gap_s / 2`` after it meets every episode in
    flight, some steps mid-request.
    """
    clients = {goal: AgentGymClient(url, timeout=30, retry_budget_s=60.0) for goal in plans}
    half = threading.Barrier(len(plans) + 1, timeout=120)
    go = threading.Event()

    def play(goal: int) -> Trace:
        client, actions = clients[goal], plans[goal]
        middle = len(actions) // 2
        trace = [(client.reset(goal)[0], 0.0, False)]
        trace += [client.step(action) for action in actions[:middle]]
        half.wait()
        go.wait()
        time.sleep(random.uniform(0, gap_s))
        for index, action in enumerate(actions[middle:]):
            time.sleep(gap_s if index else 0.0)
            trace.append(client.step(action))
            if trace[-1][2]:
                break
        assert client.close() == {"closed": True}
        return trace

    with ThreadPoolExecutor(len(plans)) as pool:
        futures = {goal: pool.submit(play, goal) for goal in plans}
        half.wait()  # every episode is mid-way
        go.set()
        time.sleep(gap_s / 2)
        disrupted = disrupt()
        traces = {goal: future.result() for goal, future in futures.items()}
    return traces, sum(client.retried for client in clients.values()), disrupted
