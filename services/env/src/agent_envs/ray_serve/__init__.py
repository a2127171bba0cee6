"""The environment as a Ray Serve application on the training job's own Ray cluster.

An adapter, like ``api``: it wraps the same FastAPI app (``api.app.create_app``) in a Serve deployment, with
replicas on every node and Serve's HTTP proxy on every node, so each node's trainer processes reach the env
at ``http://127.0.0.1:<port>`` and stay on their own node's replicas (Serve's proxies prefer local replicas).

- ``app``: the deployment (one replica = one FastAPI app over the prepared catalog) and ``build``, the
  application builder that ``serve deploy`` / ``serve run`` import.
- ``deploy``: what ``agent-envs serve-ray`` does from a driver: the state secret into the cluster's
  key-value store, the catalog onto every node (shared path, or a per-node copy made by Ray tasks), deploy,
  wait until every node serves, print the per-node URLs.
- ``nodes``: the per-node proxy URLs a client uses (its own node's first), for ``AGENTRL_ENV=ray``.
- ``limits``: the balancer's request limits (header and body size and time, JSON errors) on Serve's proxies.
- ``attach``: attaching to the cluster within a bounded time, with a clear error when its head is gone.

Ray is imported lazily: the core, the HTTP service and the env image do not need it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: Serve's HTTP proxy port on every node (``AGENTRL_RAY_PORT``); Serve's own default is 8000.
DEFAULT_PORT = 36080
#: The Serve application's name and route prefix. Kept from when WebShop was the one environment served: a
#: cluster's running application is found, kept or updated by this name, and one deployed by hand under another
#: name would share its route prefix ("/") with it.
DEFAULT_APP_NAME = "webshop"
#: The application's one deployment (the env replicas), and its name before it served any environment: a running
#: application deployed under the old name is recognised (its arguments kept or updated) until redeployed.
DEPLOYMENT_NAME = "EnvReplicas"
OLD_DEPLOYMENT_NAMES = ("WebShop",)
#: Where the shared state secret lives in Ray's key-value store (namespace, key). A stored name: a new one would
#: make a cluster's replicas sign with a new secret, and the episodes in flight across an upgrade would be lost.
SECRET_KV_NAMESPACE = "webshop_env"
SECRET_KV_KEY = "state_secret"
#: Where Ray keeps this user's cluster auth token (Ray's own default path).
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"


def needs_token_mode(environ: Mapping[str, str] = os.environ) -> bool:
    """True when a Ray client should get ``RAY_AUTH_MODE=token``: a token is at hand and no mode is set.

    Why: Ray 2.60 turns token auth on for a cluster that ``ray start --head`` makes where
    ``~/.ray/auth_token`` exists (a local ``ray.init`` writes it), but a client given an explicit address
    (``--address``, ``RAY_ADDRESS``) never sends the token unless ``RAY_AUTH_MODE=token``: it then fails with
    "Authentication token is missing or incorrect". A cluster without token auth accepts such a client too.
    """
    if environ.get("RAY_AUTH_MODE") is not None:
        return False
    return bool(
        environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH") or DEFAULT_TOKEN_PATH.is_file()
    )
