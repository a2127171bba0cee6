"""OpenEnv's own client (``openenv`` from PyPI, unmodified), driven from the test suite over stdin and stdout.

The fleet runs from ``.venv`` (the project's pins); OpenEnv's client needs packages that ``.venv`` cannot hold
(fastmcp 3, gradio: constraints-trl.txt), so it lives in ``.venv-trl`` and the tests drive it through this process:
one JSON command per line in, one JSON answer per line out (``{"id", "ok"}`` or ``{"id", "error": {"type",
"message"}}``). ``tests/openenv/_openenv.py`` is the other end.

Commands: ``open`` (a ``GenericEnvClient``, or what ``AutoEnv.from_env`` gives), ``reset``, ``step``, ``state``,
``close`` on one client; ``episodes`` plays many episodes at once, each in its own client and thread, pausing all of
them part-way (``pause``: after that many actions) until ``resume``, so a test can kill a replica while they are
mid-episode; ``results`` waits for them; ``raw`` sends frames the client never would (bad JSON, unknown types) over
the ``websockets`` library; ``validate`` checks an answer against OpenEnv's own pydantic models; ``facts`` reports the
installed client's protocol (tests/openenv/test_protocol_drift.py).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
import threading
import time
import traceback
import uuid
from importlib import metadata
from typing import Any

from openenv import AutoEnv, GenericEnvClient
from websockets.exceptions import ConnectionClosed

RETRIES = 20  # attempts of one message after a connection error (a replica died under it)
RETRY_PAUSE_S = 0.25


def _result(result: Any) -> dict[str, Any]:
    return {"observation": result.observation, "reward": result.reward, "done": result.done,
            "metadata": result.metadata}  # fmt: skip


class Episodes:
    """Episodes played at once, each by its own OpenEnv client in its own thread (see the module docstring)."""

    def __init__(self, specs: list[dict[str, Any]], pause: int | None, think_s: float, retry: bool) -> None:
        self.specs = specs
        self.pause = pause
        self.think_s = think_s
        self.retry = retry
        self.paused = threading.Semaphore(0)
        self.go = threading.Event()
        self.out: list[dict[str, Any] | None] = [None] * len(specs)
        self.threads = [
            threading.Thread(target=self._play, args=(i,), daemon=True) for i in range(len(specs))
        ]
        for thread in self.threads:
            thread.start()

    def _send(self, record: dict[str, Any], call: Any) -> Any:
        """``call()``, again after a connection error when retrying (the same message: the same request_id)."""
        for attempt in range(RETRIES if self.retry else 1):
            try:
                return call()
            except (ConnectionClosed, ConnectionError, OSError) as error:
                record["connection_errors"].append(f"{type(error).__name__}: {error}"[:200])
                if not self.retry or attempt == RETRIES - 1:
                    raise
                time.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")

    def _play(self, index: int) -> None:
        spec = self.specs[index]
        record: dict[str, Any] = {"trace": [], "connection_errors": [], "error": None, "paused": False}
        self.out[index] = record
        client = None
        try:
            client = GenericEnvClient(base_url=spec["base_url"]).sync()
            client.connect()
            reset = {"task": spec["task"], **({"request_id": uuid.uuid4().hex} if self.retry else {})}
            record["trace"].append(_result(self._send(record, lambda: client.reset(**reset))))
            for number, action in enumerate(spec["actions"]):
                if self.pause is not None and number == self.pause:
                    record["paused"] = True
                    self.paused.release()
                    self.go.wait()
                if self.think_s:
                    time.sleep(self.think_s)
                message = {"action": action, **({"request_id": uuid.uuid4().hex} if self.retry else {})}
                result = self._send(record, lambda message=message: client.step(message))
                record["trace"].append(_result(result))
                if result.done:
                    break
            record["state"] = self._send(record, client.state)
        except Exception as error:
            record["error"] = f"{type(error).__name__}: {error}"[:500]
        finally:
            if self.pause is not None and not record["paused"]:
                self.paused.release()  # never reached the pause: do not hold the others' wait
            if client is not None:
                with contextlib.suppress(Exception):  # the connection may be gone with its replica
                    client.close()

    def wait_paused(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        for _ in self.specs:
            if not self.paused.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        return sum(bool(r and r["paused"]) for r in self.out)

    def results(self, timeout: float) -> list[dict[str, Any] | None]:
        self.go.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.out


def facts() -> dict[str, Any]:
    """The installed client's protocol: what it sends, what it reads, and what OpenEnv's own server serves."""
    from fastapi import FastAPI
    from openenv.core import env_client
    from openenv.core.env_server import types
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.interfaces import Environment

    class Probe(Environment):  # the smallest environment OpenEnv's server takes, to list the routes it serves
        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
        ) -> types.Observation:
            return types.Observation()

        def step(self, action: types.Action, **kwargs: Any) -> types.Observation:
            return types.Observation()

        @property
        def state(self) -> types.State:
            return types.State()

    app = FastAPI()
    HTTPEnvServer(Probe, types.Action, types.Observation).register_routes(app)
    routes = sorted({(method, route.path) for route in app.routes for method in getattr(route, "methods", None) or ()
                     if route.path in ("/reset", "/step", "/state", "/health", "/metadata", "/schema")})  # fmt: skip
    websockets = sorted(route.path for route in app.routes if type(route).__name__ == "APIWebSocketRoute")
    client = GenericEnvClient(base_url="http://host:1/prefix")
    ws_url = client._ws_url  # what the client connects to: the base URL's path, then /ws
    sources = {name: inspect.getsource(getattr(env_client.EnvClient, name))
               for name in ("_reset_async", "_step_async", "_state_async", "_send_and_receive")}  # fmt: skip
    return {
        "versions": {name: metadata.version(name) for name in ("openenv", "trl") if _installed(name)},
        "ws_suffix": ws_url.removeprefix("ws://host:1/prefix"),
        "websocket_routes": websockets,
        "client_messages": [
            m.model_fields["type"].default
            for m in (types.WSResetMessage, types.WSStepMessage, types.WSStateMessage, types.WSCloseMessage)
        ],
        "answers": [
            m.model_fields["type"].default
            for m in (types.WSObservationResponse, types.WSStateResponse, types.WSErrorResponse)
        ],
        "error_codes": [code.value for code in types.WSErrorCode],
        "observation_fields": sorted(types.StepResponse.model_fields),
        "reset_response_fields": sorted(types.ResetResponse.model_fields),
        "state_fields": sorted(types.State.model_fields),
        "http_routes": [list(route) for route in routes],
        "reset_fields": sorted(types.ResetRequest.model_fields),
        "step_fields": sorted(types.StepRequest.model_fields),
        "schema_fields": sorted(types.SchemaResponse.model_fields),
        "metadata_fields": sorted(types.EnvironmentMetadata.model_fields),
        "health": json.loads(types.HealthResponse().model_dump_json()),
        "required": {
            name: sorted(
                field for field, info in getattr(types, name).model_fields.items() if info.is_required()
            )
            for name in (
                "StepResponse",
                "ResetResponse",
                "State",
                "ResetRequest",
                "StepRequest",
                "SchemaResponse",
                "EnvironmentMetadata",
                "WSErrorResponse",
            )
        },  # fmt: skip
        "client_reads": {
            name: sorted(
                {
                    part
                    for part in ("data", "type", "error", "message", "code")
                    if f'"{part}"' in source or f"'{part}'" in source
                }
            )
            for name, source in sources.items()
        },  # fmt: skip
        "generic_parse": inspect.getsource(GenericEnvClient._parse_result),
    }


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def validate(model: str, value: Any) -> str:
    """``value`` validated by OpenEnv's own model of that name (extra fields refused where the model refuses
    them): the answer's shape is OpenEnv's."""
    from openenv.core.env_server import types

    getattr(types, model).model_validate(value)
    return "ok"


async def _raw(url: str, frames: list[str]) -> list[Any]:
    from websockets.asyncio.client import connect

    answers = []
    async with connect(url, proxy=None) as socket:
        for frame in frames:
            await socket.send(frame)
            answers.append(json.loads(await socket.recv()))
    return answers


def main() -> None:
    clients: dict[str, Any] = {}
    episodes: Episodes | None = None
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "open":
                if command.get("auto"):
                    client = AutoEnv.from_env(
                        command["name"], base_url=command["base_url"], skip_install=True
                    )
                    answer: Any = type(client).__name__
                else:
                    client, answer = GenericEnvClient(base_url=command["base_url"]), "GenericEnvClient"
                clients[command["client"]] = client.sync()
                clients[command["client"]].connect()
            elif op == "reset":
                answer = _result(clients[command["client"]].reset(**command.get("kwargs", {})))
            elif op == "step":
                answer = _result(clients[command["client"]].step(command["action"]))
            elif op == "state":
                answer = clients[command["client"]].state()
            elif op == "close":
                clients.pop(command["client"]).close()
                answer = True
            elif op == "episodes":
                episodes = Episodes(command["specs"], command.get("pause"), command.get("think_s", 0.0),
                                    command.get("retry", False))  # fmt: skip
                answer = (
                    episodes.wait_paused(command.get("timeout", 120.0))
                    if command.get("pause") is not None
                    else 0
                )
            elif op == "results":
                assert episodes is not None
                answer = episodes.results(command.get("timeout", 300.0))
            elif op == "raw":
                import asyncio

                answer = asyncio.run(_raw(command["url"], command["frames"]))
            elif op == "validate":
                answer = validate(command["model"], command["value"])
            elif op == "facts":
                answer = facts()
            else:
                raise ValueError(f"unknown op {op!r}")
            reply = {"id": command["id"], "ok": answer}
        except Exception as error:
            reply = {"id": command["id"], "error": {"type": type(error).__name__, "message": str(error),
                                                    "traceback": traceback.format_exc()[-2000:]}}  # fmt: skip
        sys.stdout.write(json.dumps(reply, default=str) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
