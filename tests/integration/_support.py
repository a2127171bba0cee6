"""Helpers shared by the integration tests (imported as ``_support``; conftest puts this folder on sys.path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from agent_envs import cluster

REPO = Path(__file__).resolve().parents[2]
SECRET = "integration-test-secret-0123456789"
COMPAT_CAP = 50


class Replica:
    """One ``agent-envs serve`` process on a free port (stopped by ``stop``)."""

    def __init__(
        self,
        catalog: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        workers: int = 1,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        lc = cluster
        self.port = lc.free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        base = dict(base_env) if base_env is not None else {**os.environ, "AGENTRL_STATE_SECRET": SECRET}
        child_env = {**base, **(env or {})}
        child_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        command = [
            sys.executable, "-m", "agent_envs.cli", "serve", "--catalog", str(catalog),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers),
        ]  # fmt: skip
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env,
                start_new_session=True,
            )  # fmt: skip
        self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while cluster.http_status(self.url + "/readyz") != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"replica did not get ready; log:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def start_cluster(lc: ModuleType, catalog: Path, run_dir: Path, env: Mapping[str, str] | None = None) -> dict:
    return lc.up(
        replicas=2, catalog=catalog, base_port=0, port=0, workers=1, run_dir=run_dir,
        env={"AGENTRL_STATE_SECRET": SECRET, **(env or {})}, timeout=60, quiet=True,
    )  # fmt: skip


def metric_value(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The value of one sample in Prometheus text format (None if absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        key, _, value = line.rpartition(" ")
        if key == name or (
            labels and key.startswith(name + "{") and all(f'{k}="{v}"' in key for k, v in labels.items())
        ):
            return float(value)
    return None


def json_of(response: Any) -> Any:
    """``response.json()`` with the body in the assertion message when it is not JSON."""
    try:
        return response.json()
    except ValueError as error:
        raise AssertionError(f"not JSON ({response.status_code}): {response.text[:500]}") from error
