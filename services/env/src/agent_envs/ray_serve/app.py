"""The Serve deployment: one replica is one ``create_app`` FastAPI app serving the environments it is given.

``build`` is the application builder that ``serve deploy`` / ``serve run`` import
(``import_path: agent_envs.ray_serve.app:build``) and that ``agent-envs serve-ray`` calls. Its arguments
(``ServeArgs``) are plain: the environments and other service settings, WebShop's catalog path where it is
served, the replicas per node; never the state secret. Each replica reads the secret when it starts, from the
cluster's key-value store (where ``agent-envs serve-ray`` puts it) or from ``state_secret_file`` (a file every
node can read), so the Serve config, ``serve status`` and the dashboard never show it. Each replica runs the served
environments' own start checks (``deploy.start_problems``, as ``agent-envs serve`` does): WebShop's is its catalog.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve

from ..api.app import create_app
from ..api.routes_ops import NOT_READY, catalog_fingerprint
from ..api.settings import Settings, SettingsError
from ..deploy import start_problems
from ..module_aliases import renamed_attributes
from . import DEFAULT_APP_NAME, DEPLOYMENT_NAME, SECRET_KV_KEY, SECRET_KV_NAMESPACE

log = logging.getLogger("agent_envs.ray_serve")


@dataclass(frozen=True)
class ServeArgs:
    """What the application is built from (the ``args:`` of a Serve config file).

    Attributes:
        catalog: WebShop's prepared catalog directory where WebShop is served, the same path on every node (a
            shared filesystem, or the per-node copies that ``agent-envs serve-ray --stage-catalog`` makes); None:
            the service's default (``WEBSHOP_CATALOG``), unused where WebShop is not served.
        replicas_per_node: replicas on each node that has ``replica_cpus`` free; more than one when a node's
            trainer processes step faster than one replica answers (see the README's sizing).
        replica_cpus: Ray CPUs each replica reserves (logical; a replica uses one core when busy).
        max_ongoing_requests: requests one replica works on at once (Serve queues the rest in its proxy).
        state_secret_file: read the state secret from this file (on every node) instead of the cluster's
            key-value store.
        settings: other service settings by field name (``api.settings.Settings``: ``envs``, ``redis_url``,
            ``max_steps``, ``default_goal_set``, ...); ``state_secret`` is refused here.
        nodes: the number of nodes to place replicas on; None: the nodes alive when the app is built.
    """

    catalog: str | None = None
    replicas_per_node: int = 1
    replica_cpus: float = 0.25
    max_ongoing_requests: int = 64
    state_secret_file: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    nodes: int | None = None

    @classmethod
    def parse(cls, values: dict[str, Any]) -> ServeArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown Serve argument(s) {unknown} of the env app; known: {sorted(known)}")
        args = cls(**values)
        args.validate()
        return args

    def validate(self) -> None:
        """Raise ``ValueError`` with the fix, before anything is deployed."""
        if self.replicas_per_node < 1:
            raise ValueError(f"replicas_per_node must be at least 1, not {self.replicas_per_node}")
        if not 0 <= self.replica_cpus <= 64 or math.isnan(self.replica_cpus):
            raise ValueError(f"replica_cpus must be between 0 and 64, not {self.replica_cpus}")
        if self.max_ongoing_requests < 1:
            raise ValueError("max_ongoing_requests must be at least 1")
        if "state_secret" in self.settings:
            raise ValueError(
                "the state secret must not be written into the Serve arguments (they are shown by `serve "
                "config` and the dashboard): use state_secret_file, or let `agent-envs serve-ray` put it "
                "into the cluster's key-value store"
            )
        if "catalog" in self.settings:
            raise ValueError("give the catalog as the catalog argument, not as a setting")
        unknown = sorted(set(self.settings) - set(Settings.model_fields))
        if unknown:
            raise ValueError(f"unknown service setting(s) {unknown}; see agent_envs.api.settings.Settings")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def schedulable_nodes(replica_cpus: float) -> list[dict[str, Any]]:
    """The alive nodes that can hold a replica (``replica_cpus`` of their CPU resource), by node IP."""
    nodes = [
        node
        for node in ray.nodes()
        if node.get("Alive") and node.get("Resources", {}).get("CPU", 0.0) >= replica_cpus
    ]
    return sorted(nodes, key=lambda node: node["NodeManagerAddress"])


def read_state_secret(secret_file: str | None) -> str:
    """The shared state secret: from ``secret_file``, else from the cluster's key-value store."""
    if secret_file:
        path = Path(secret_file)
        try:
            value = path.read_text().strip()
        except OSError as error:
            raise SettingsError(f"cannot read the state secret file {path} on this node: {error}") from error
        if not value:
            raise SettingsError(f"the state secret file {path} is empty")
        return value
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(SECRET_KV_KEY, namespace=SECRET_KV_NAMESPACE)
    if not value:
        raise SettingsError(
            "no state secret in this Ray cluster's key-value store: deploy with `agent-envs serve-ray` (it "
            "stores one), or give state_secret_file"
        )
    return value.decode()


def replica_settings(args: ServeArgs, state_secret: str, node: str) -> Settings:
    """A replica's settings, or ``SettingsError`` with what this node lacks: each served environment's own start
    check (its registration's ``check``: WebShop's prepared catalog), as ``agent-envs serve`` runs them."""
    data = {"catalog": Path(args.catalog)} if args.catalog is not None else {}
    settings = Settings(**args.settings, **data, state_secret=state_secret)
    problems = start_problems(settings)
    if problems:
        where = (
            " (each replica checks its own node: a path given to serve-ray must be on a filesystem every node reads, "
            "or copied to every node with `agent-envs serve-ray --stage-catalog`; a program such as Java must be "
            "installed on every node)"
        )
        raise SettingsError(f"node {node} cannot serve {settings.envs}: {'; '.join(problems)}{where}")
    return settings


# One replica per actor process: the constructor leaves its settings here for the app builder below, which
# Serve calls right after the constructor (``serve.ingress`` with a builder function). Both go through
# module-level functions: Serve ships the deployment class by value (its methods see a copy of this module's
# globals), but these functions by reference, so they share this module's one variable.
_replica_settings: Settings | None = None


def _set_replica_settings(settings: Settings) -> None:
    global _replica_settings
    _replica_settings = settings


def _build_replica_app() -> FastAPI:
    if _replica_settings is None:
        raise RuntimeError("the env replica's settings were not made before its app")
    return create_app(_replica_settings)


@serve.deployment(
    name=DEPLOYMENT_NAME,
    health_check_period_s=5,
    health_check_timeout_s=10,
    graceful_shutdown_timeout_s=5,
)
@serve.ingress(_build_replica_app)
class EnvReplica:
    """A Serve replica of the env service, serving the environments its arguments name (the constructor makes its
    settings; Serve then builds the app)."""

    def __init__(self, args: dict[str, Any]) -> None:
        parsed = ServeArgs.parse(args)
        _set_replica_settings(
            replica_settings(
                parsed, read_state_secret(parsed.state_secret_file), ray.util.get_node_ip_address()
            )
        )

    def check_health(self) -> None:
        """Serve's health check: the question ``/readyz`` answers (is the catalog open?)."""
        if catalog_fingerprint(self.app) is None:  # type: ignore[attr-defined]  # set by serve.ingress
            raise RuntimeError(NOT_READY)


def bind(args: ServeArgs, nodes: int) -> serve.Application:
    """The application: ``replicas_per_node`` replicas on each of ``nodes`` nodes (Serve spreads them, at most
    ``replicas_per_node`` on one node)."""
    return EnvReplica.options(
        num_replicas=args.replicas_per_node * nodes,
        max_replicas_per_node=args.replicas_per_node,
        max_ongoing_requests=args.max_ongoing_requests,
        ray_actor_options={"num_cpus": args.replica_cpus},
    ).bind(args.as_dict())


def build(args: dict[str, Any]) -> serve.Application:
    """The application builder of ``serve deploy`` / ``serve run`` (``args`` as in ``ServeArgs``)."""
    parsed = ServeArgs.parse(args)
    nodes = parsed.nodes or len(schedulable_nodes(parsed.replica_cpus))
    if nodes < 1:
        raise ValueError(f"no alive node of this Ray cluster has {parsed.replica_cpus} CPU for a replica")
    log.info(
        "the env service on Ray Serve: %d replica(s) on each of %d node(s)", parsed.replicas_per_node, nodes
    )
    return bind(parsed, nodes)


__all__ = [
    "DEFAULT_APP_NAME",
    "EnvReplica",
    "ServeArgs",
    "bind",
    "build",
    "read_state_secret",
    "replica_settings",
]


#: ``WebShopReplica``, the deployment class's old name, for one release (with a deprecation warning).
__getattr__ = renamed_attributes(__name__, {"WebShopReplica": "EnvReplica"}, "it serves any environment")
