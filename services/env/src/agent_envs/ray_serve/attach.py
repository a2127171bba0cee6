"""Attach to a running Ray cluster within a bounded time, or fail with what to do.

Why: ``ray.init(address=...)`` waits for a head that is gone (its GCS killed, its node down or unreachable)
for minutes, logging only "Failed to connect to GCS": a command that attaches to the cluster (``agent-envs
serve-ray``, ``agent-train env-check``, the training launcher) would hang instead of saying that the head,
the cluster's single point of failure, is lost. ``attach`` first checks that the head's GCS port accepts a
TCP connection (a dead head refuses it, a blackholed or downed node does not answer), then runs ``ray.init``
with a deadline.

The launcher, which hands the attach to verl's own ``ray.init`` in a child process, calls ``check_head``
before it starts verl.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

#: Seconds a command waits for the head before it gives up (``AGENTRL_RAY_ATTACH_TIMEOUT_S``).
DEFAULT_ATTACH_TIMEOUT_S = 60.0
#: The longest single TCP connect to the head (a live head accepts in milliseconds).
PROBE_TIMEOUT_S = 10.0


class AttachError(ConnectionError):
    """The Ray cluster's head could not be reached in time; the message says which and what to do."""


def attach_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """``AGENTRL_RAY_ATTACH_TIMEOUT_S`` (seconds, > 0), else :data:`DEFAULT_ATTACH_TIMEOUT_S`."""
    raw = environ.get("AGENTRL_RAY_ATTACH_TIMEOUT_S", "").strip()
    if not raw:
        return DEFAULT_ATTACH_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"AGENTRL_RAY_ATTACH_TIMEOUT_S={raw!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"AGENTRL_RAY_ATTACH_TIMEOUT_S must be positive, not {raw!r}")
    return value


def head_address(address: str | None = None) -> str:
    """The head's GCS ``host:port`` as ``ray.init`` would resolve ``address`` (None or ``auto``:
    ``RAY_ADDRESS``, else the cluster this machine's last ``ray start`` joined)."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        resolved = canonicalize_bootstrap_address(address or "auto")
    except (ValueError, ConnectionError) as error:
        raise AttachError(f"cannot resolve the Ray address {address or 'auto'!r}: {error}") from error
    if resolved is None:
        raise AttachError(
            f"no Ray cluster found for address {address or 'auto'!r}: start one (`ray start --head`, `make "
            "up-ray`) or give its address (--address HOST:PORT, RAY_ADDRESS)"
        )
    return resolved


def check_head(address: str | None = None, timeout: float | None = None) -> str:
    """Raise ``AttachError`` unless the head's GCS port accepts a TCP connection within ``timeout`` seconds
    (default: :func:`attach_timeout`, at most :data:`PROBE_TIMEOUT_S`); returns the ``host:port`` checked."""
    if address and address.startswith("ray://"):
        return address  # Ray Client: its own server, not the GCS; ray.init's deadline below still applies
    target = head_address(address)
    host, _, port = target.rpartition(":")
    limit = min(attach_timeout() if timeout is None else timeout, PROBE_TIMEOUT_S)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=limit):
            return target
    except TimeoutError:
        problem = f"does not answer within {limit:g} s (its node is down or unreachable)"
    except OSError as error:
        if error.errno == errno.ECONNREFUSED:
            problem = "refuses connections (no Ray head runs there any more)"
        else:
            problem = f"cannot be reached ({error.strerror or error})"
    raise AttachError(_lost(target, problem))


def attach(address: str | None = None, timeout: float | None = None, **init_kwargs: Any) -> None:
    """``ray.init(address=address or "auto", **init_kwargs)``, or ``AttachError`` within ``timeout`` seconds
    (default :func:`attach_timeout`).

    After a timeout the abandoned ``ray.init`` goes on in a daemon thread; a command should exit then (it
    cannot use Ray in this process any more).
    """
    import ray

    limit = attach_timeout() if timeout is None else timeout
    if limit <= 0:
        raise ValueError("the attach timeout must be positive")
    started = time.monotonic()
    target = check_head(address, limit)
    outcome: dict[str, BaseException | None] = {}

    def init() -> None:
        try:
            ray.init(address=address or "auto", **init_kwargs)
            outcome["error"] = None
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=init, name="ray-attach", daemon=True)
    thread.start()
    thread.join(max(0.0, limit - (time.monotonic() - started)))
    if thread.is_alive():
        raise AttachError(
            _lost(
                target,
                f"accepts connections but Ray did not attach within {limit:g} s (a hung or restarting "
                "head, or a GCS that lost its state)",
            )  # fmt: skip
        )
    error = outcome.get("error")
    if isinstance(error, ConnectionError):
        raise AttachError(_lost(target, f"refused the attach: {error}")) from error
    if error is not None:
        raise error


def _lost(target: str, problem: str) -> str:
    return (
        f"the Ray head at {target} {problem}. Check the address (--address, RAY_ADDRESS). If the head was lost, so "
        "were the cluster and the training job on it (the head is a single point of failure): start the cluster "
        "again, or requeue the Slurm job, which resumes from its last checkpoint. AGENTRL_RAY_ATTACH_TIMEOUT_S "
        "sets how long to wait"
    )
