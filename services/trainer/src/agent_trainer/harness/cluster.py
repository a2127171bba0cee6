"""The env service a CPU run plays against: one already running that serves the run's catalog (and environments),
else ``make up-local``'s topology of our own (replicas behind a real nginx) on free ports, stopped afterwards.

So the preflight, the rehearsal and ``make learn`` reach the environments as a training run does: through the
real balancer, real replicas and signed state tokens.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import HarnessError

#: How long a cluster of our own gets to answer: WebShop's replicas alone, and replicas that serve other
#: environments too (they have more to load).
START_TIMEOUT_S = 120.0
START_TIMEOUT_ENVS_S = 180.0


def get_json(url: str, timeout: float = 2.0) -> Any:
    """The JSON at ``url``, or None when nothing answers there with JSON (a probe: it never raises)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


@dataclass
class Cluster:
    """The env service a run talks to: its URL, whether it was running already (``reused``) and, for one this
    process started, its run directory and how to stop it."""

    url: str
    reused: bool
    run_dir: Path | None = None
    stop: Callable[[], Any] | None = None


def start_cluster(catalog_dir: Path, run_dir: Path, replicas: int = 2, served: Sequence[str] | None = None
                  ) -> Cluster:  # fmt: skip
    """Replicas + nginx of our own on free ports, recorded in ``run_dir`` (a previous run's, killed before it
    stopped them, are stopped first); ``served``: the environments the replicas serve (``AGENTRL_ENVS``; None:
    the service's default, WebShop)."""
    from agent_envs import cluster

    run_dir.mkdir(parents=True, exist_ok=True)
    cluster.down(run_dir, quiet=True)  # a previous run that was killed
    env = None if served is None else {"AGENTRL_ENVS": ",".join(served)}
    timeout = START_TIMEOUT_S if served is None else START_TIMEOUT_ENVS_S
    try:
        record = cluster.up(replicas=replicas, catalog=catalog_dir, base_port=0, port=0, workers=1, run_dir=run_dir,
                            env=env, timeout=timeout, quiet=True)  # fmt: skip
    except cluster.ClusterError as error:
        what = "" if served is None else f" ({','.join(served)})"
        raise HarnessError(f"could not start the local env cluster{what}: {error}") from None
    return Cluster(
        url=record["url"], reused=False, run_dir=run_dir, stop=lambda: cluster.down(run_dir, quiet=True)
    )


def start_or_reuse_env_cluster(catalog_dir: Path, fingerprint: str, env_ids: Sequence[str], run_dir: Path,
                               env_url: str | None, replicas: int = 2) -> Cluster:  # fmt: skip
    """The service at ``env_url`` when it serves every one of ``env_ids`` (those that play the catalog, their spec
    ``needs_catalog``, with this catalog), else replicas + nginx of our own. A run's own cluster also serves the
    environments that play the catalog, whichever it needs, so that a later run on them can reuse it; a service
    someone else started needs to serve the run's environments only (``make train-test ENV=babyai`` serves BabyAI
    alone)."""
    from .. import envs

    if env_url and all(_serves(env_url.rstrip("/"), env_id, fingerprint) for env_id in env_ids):
        return Cluster(url=env_url.rstrip("/"), reused=True)
    served = list(dict.fromkeys([*(e for e, spec in envs.specs().items() if spec.needs_catalog), *env_ids]))
    return start_cluster(catalog_dir, run_dir, replicas, served=served)


def _serves(url: str, env_id: str, fingerprint: str) -> bool:
    """Whether the service at ``url`` serves ``env_id`` (``/<env>/v1/info`` answers), on this catalog where the
    environment plays one (its info's ``fingerprint``)."""
    from .. import envs

    info = get_json(f"{url}/{env_id}/v1/info")
    return bool(info) and (not envs.get(env_id).needs_catalog or info.get("fingerprint") == fingerprint)
