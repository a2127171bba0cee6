"""What the OpenEnv and TRL suites share (imported as ``_openenv``; conftest puts this folder on sys.path).

- ``OpenEnvDriver(python)``: the test suite's end of ``_openenv_driver.py``, OpenEnv's real client running in
  ``.venv-trl``. ``call(op, **fields)`` sends one command and returns its answer, or raises ``DriverError`` with the
  client's exception type and message (what a user of OpenEnv's client would see).
- ``start_fleet``: the local cluster (replicas, Redis, nginx) serving some environments, from ``.venv``.
- ``trl_python``: the interpreter of ``.venv-trl`` (or ``$TRL_PYTHON``).
- ``play``, ``core_trace``, ``openenv_trace``: an episode through OpenEnv's client, the same by the environment's
  core in process, and the client's answers as (observation, reward, done), to compare them.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_envs import cluster

DRIVER = Path(__file__).with_name("_openenv_driver.py")
REPO = Path(__file__).resolve().parents[2]
SECRET = "openenv-suite-secret-0123456789-abcdef"
FLEET_ENVS = "webshop,textcraft,babyai,sciworld"


def trl_python() -> Path | None:
    """The interpreter of the TRL + OpenEnv environment: ``$TRL_PYTHON``, else ``.venv-trl/bin/python``."""
    path = Path(os.environ.get("TRL_PYTHON") or REPO / ".venv-trl" / "bin" / "python")
    return path if path.exists() else None


def start_fleet(catalog: Path, run_dir: Path, envs: str, replicas: int = 2, workers: int = 2) -> dict:
    """The local cluster serving ``envs`` on free ports (``cluster.down(run_dir)`` stops it)."""
    return cluster.up(
        replicas=replicas, catalog=catalog, base_port=0, port=0, workers=workers, run_dir=run_dir, timeout=180,
        env={"AGENTRL_STATE_SECRET": SECRET, "AGENTRL_WATCHDOG_INTERVAL_S": "0", "AGENTRL_ENVS": envs}, quiet=True,
    )  # fmt: skip


class DriverError(Exception):
    """An exception OpenEnv's client raised in the driver (``kind``: its type, ``message``: its text)."""

    def __init__(self, kind: str, message: str, trace: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.trace = trace


class OpenEnvDriver:
    """One driver process; its commands are answered in order (a lock keeps one in flight)."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self._process: subprocess.Popen[str] | None = None
        self._next = 0
        self._lock = threading.Lock()

    def __enter__(self) -> OpenEnvDriver:
        self._process = subprocess.Popen(
            [str(self.python), str(DRIVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        process = self._process
        if process is not None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def call(self, op: str, **fields: Any) -> Any:
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        with self._lock:
            self._next += 1
            number = self._next
            process.stdin.write(json.dumps({"id": number, "op": op, **fields}) + "\n")
            process.stdin.flush()
            line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the OpenEnv driver exited (status {process.poll()}) during {op}")
        reply = json.loads(line)
        assert reply["id"] == number
        if "error" in reply:
            error = reply["error"]
            raise DriverError(error["type"], error["message"], error.get("traceback", ""))
        return reply["ok"]


def core_trace(core: Any, task: int, actions: Sequence[str]) -> list[tuple[str, float, bool]]:
    """(observation, reward, done) of the reset and of each action, by the core itself."""
    result = core.reset(task)
    trace = [(result.observation, float(result.reward), result.done)]
    state = result.state
    for action in actions:
        result = core.step(state, action)
        trace.append((result.observation, float(result.reward), result.done))
        state = result.state
        if result.done:
            break
    closer = getattr(core, "close", None)
    if callable(closer):
        closer(state)
    return trace


def openenv_trace(answers: Sequence[dict[str, Any]]) -> list[tuple[str, float, bool]]:
    return [(a["observation"]["text"], float(a["reward"]), a["done"]) for a in answers]


def play(driver: OpenEnvDriver, client: str, task: int, actions: Sequence[str]) -> list[dict[str, Any]]:
    answers = [driver.call("reset", client=client, kwargs={"task": task})]
    for action in actions:
        answers.append(driver.call("step", client=client, action={"action": action}))
        if answers[-1]["done"]:
            break
    return answers
