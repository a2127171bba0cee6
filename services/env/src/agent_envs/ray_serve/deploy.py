"""``agent-envs serve-ray`` from a driver: secret, catalog, deploy, wait until every node serves.

Steps, each of which can be re-run (a second deploy updates the app in place):

1. ``store_state_secret``: the shared state secret goes into the cluster's key-value store (GCS), where the
   replicas read it; an existing one is kept, so a redeploy never invalidates running episodes' tokens.
2. ``stage_catalog`` (optional): a copy of the prepared catalog on every node, written by a Ray task pinned
   to that node; nodes that already hold a copy with the same fingerprint are skipped. Without it the catalog
   path must be on a filesystem every node reads.
3. ``deploy``: Serve's proxies on every node on one port, the app with ``replicas_per_node`` replicas per node.
4. ``wait_every_node``: until every node has its replicas running and its own proxy answers ``/readyz`` from
   that node (``http://127.0.0.1:<port>``, asked by a task pinned there).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import secrets
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..envs.webshop.catalog.store import MANIFEST
from . import (
    DEFAULT_APP_NAME,
    DEFAULT_PORT,
    DEPLOYMENT_NAME,
    OLD_DEPLOYMENT_NAMES,
    SECRET_KV_KEY,
    SECRET_KV_NAMESPACE,
    needs_token_mode,
)
from .app import ServeArgs, bind, schedulable_nodes
from .attach import AttachError, attach
from .limits import ProxyLimits

#: Files of a catalog travel to the nodes in chunks of this size (objects in Ray's object store).
CHUNK_BYTES = 32 * 1024 * 1024
DEFAULT_STAGE_ROOT = "/tmp/webshop-catalog"


class DeployError(RuntimeError):
    """The app could not be deployed or did not come up on every node; the message says what to do."""


def connect(address: str | None, timeout: float | None = None) -> None:
    """Attach this process to a running Ray cluster (``auto``: the one this machine is part of), or raise
    ``DeployError`` within ``timeout`` seconds (``attach``: a dead head must not hang the command)."""
    if ray.is_initialized():
        return
    use_cluster_token()
    try:
        attach(address, timeout, log_to_driver=False, logging_level="WARNING")
    except AttachError as error:
        raise DeployError(str(error)) from error


def use_cluster_token() -> None:
    """Send this machine's Ray auth token when there is one and no mode is set (``needs_token_mode``)."""
    if needs_token_mode():
        os.environ["RAY_AUTH_MODE"] = "token"
        with contextlib.suppress(ImportError, AttributeError):  # Ray caches the mode; 2.49 has no token auth
            from ray._private.authentication.authentication_token_setup import _enable_token_auth

            _enable_token_auth()


def wait_nodes(count: int, timeout: float, progress: Callable[[str], None] = lambda message: None) -> None:
    """Wait until the cluster has ``count`` alive nodes (a job script's workers join after its head)."""
    deadline = time.monotonic() + timeout
    alive = -1
    while True:
        now = sum(1 for node in ray.nodes() if node.get("Alive"))
        if now >= count:
            return
        if now != alive:
            progress(f"{now} of {count} Ray node(s) alive")
            alive = now
        if time.monotonic() > deadline:
            raise DeployError(
                f"only {now} of {count} Ray nodes joined within {timeout:.0f} s: see their logs"
            )
        time.sleep(1.0)


def store_state_secret(secret: str | None) -> str:
    """Put the state secret into the cluster's key-value store; returns where it came from (never the value).

    ``secret`` None: keep the cluster's secret if it has one, else draw a new one.
    """
    from ray.experimental import internal_kv

    if secret:
        internal_kv._internal_kv_put(
            SECRET_KV_KEY, secret.encode(), overwrite=True, namespace=SECRET_KV_NAMESPACE
        )
        return "given"
    if internal_kv._internal_kv_exists(SECRET_KV_KEY, namespace=SECRET_KV_NAMESPACE):
        return "kept"
    internal_kv._internal_kv_put(
        SECRET_KV_KEY, secrets.token_urlsafe(32).encode(), overwrite=False, namespace=SECRET_KV_NAMESPACE
    )
    return "generated"


# ---- catalog on every node -------------------------------------------------------------------------------
def _fingerprint(catalog: Path) -> str:
    return str(json.loads((catalog / MANIFEST).read_text())["fingerprint"])


def _has_catalog(dest: str, fingerprint: str) -> bool:
    try:
        return _fingerprint(Path(dest)) == fingerprint
    except (OSError, ValueError, KeyError):
        return False


_node_has_catalog = ray.remote(num_cpus=0)(_has_catalog)


@ray.remote(num_cpus=0)
def _write_catalog(dest: str, fingerprint: str, files: list[tuple[str, int, list[Any]]]) -> str:
    """Write the catalog's files under ``dest`` (into a temporary sibling, renamed when complete)."""
    target = Path(dest)
    if _has_catalog(dest, fingerprint):  # another deploy got here first
        return "present"
    partial = target.with_name(f"{target.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        for relative, size, chunks in files:
            path = partial / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as out:
                for chunk in chunks:
                    out.write(ray.get(chunk))
            if path.stat().st_size != size:
                raise OSError(f"{relative}: wrote {path.stat().st_size} bytes, expected {size}")
        if _fingerprint(partial) != fingerprint:
            raise OSError("the copied manifest does not carry the expected fingerprint")
        if target.exists() and not _has_catalog(dest, fingerprint):
            shutil.rmtree(target)  # an incomplete copy of an older, killed deploy
        try:
            partial.rename(target)
        except OSError:
            # another node finished first: the same filesystem (a shared /tmp) holds one copy for both
            if not _has_catalog(dest, fingerprint):
                raise
            return "present"
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return "copied"


def _on_node(function: Any, node_id: str) -> Any:
    return function.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))


def stage_catalog(
    catalog: Path, stage_root: str = DEFAULT_STAGE_ROOT, nodes: list[dict[str, Any]] | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> tuple[str, dict[str, str]]:  # fmt: skip
    """Copy ``catalog`` to ``<stage_root>/<fingerprint>`` on every node; returns (that path, node IP -> what
    happened there: ``present`` or ``copied``)."""
    catalog = Path(catalog)
    if not (catalog / MANIFEST).is_file():
        raise DeployError(f"{catalog} is not a prepared catalog (no {MANIFEST}): `make data` builds one")
    fingerprint = _fingerprint(catalog)
    dest = f"{stage_root.rstrip('/')}/{fingerprint}"
    nodes = nodes if nodes is not None else [node for node in ray.nodes() if node.get("Alive")]
    present = ray.get(
        [_on_node(_node_has_catalog, node["NodeID"]).remote(dest, fingerprint) for node in nodes]
    )
    outcome = {node["NodeManagerAddress"]: "present" for node, has in zip(nodes, present, strict=True) if has}
    missing = [node for node, has in zip(nodes, present, strict=True) if not has]
    if missing:
        files = sorted(path for path in catalog.rglob("*") if path.is_file())
        total = sum(path.stat().st_size for path in files)
        progress(
            f"copying the catalog ({total / 2**20:.1f} MiB, {len(files)} files) to {len(missing)} node(s)"
        )
        payload = []
        for path in files:
            chunks = []
            with path.open("rb") as source:
                while block := source.read(CHUNK_BYTES):
                    chunks.append(ray.put(block))
            payload.append((str(path.relative_to(catalog)), path.stat().st_size, chunks))
        results = ray.get(
            [_on_node(_write_catalog, node["NodeID"]).remote(dest, fingerprint, payload) for node in missing]
        )
        outcome.update(
            {node["NodeManagerAddress"]: result for node, result in zip(missing, results, strict=True)}
        )
    return dest, outcome


# ---- deploy and check ------------------------------------------------------------------------------------
def _args_key(app_name: str) -> bytes:
    return f"webshop-serve-args/{app_name}".encode()


def recorded_deployment(app_name: str) -> tuple[ServeArgs, int] | None:
    """The arguments and node count the app was last deployed with (kept in the cluster's key-value store)."""
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_get(_args_key(app_name), namespace=SECRET_KV_NAMESPACE)
    if not raw:
        return None
    try:
        record = json.loads(raw)
        return ServeArgs.parse(record["args"]), int(record["nodes"])
    except (ValueError, KeyError, TypeError):
        return None


def _record_deployment(app_name: str, args: ServeArgs, nodes: int) -> None:
    from ray.experimental import internal_kv

    value = json.dumps({"args": args.as_dict(), "nodes": nodes}).encode()
    internal_kv._internal_kv_put(_args_key(app_name), value, overwrite=True, namespace=SECRET_KV_NAMESPACE)


def deploy(
    args: ServeArgs, app_name: str = DEFAULT_APP_NAME, port: int = DEFAULT_PORT, host: str = "0.0.0.0",
    progress: Callable[[str], None] = lambda message: None, if_missing: bool = False,
    limits: ProxyLimits | None = None,
) -> tuple[int, ServeArgs]:  # fmt: skip
    """Start Serve (proxies on every node, on ``host:port``) and deploy the app; returns the node count and the
    arguments the app runs with.

    An app already deployed with the same arguments on the same number of nodes is kept as it is (Ray gives
    every ``serve.run`` a new version, which would restart every replica). With ``if_missing`` an app that is
    deployed is kept whatever its arguments (the training launcher: a by-hand deployment with its own replicas
    and catalog path must survive a training start); its recorded arguments are returned.

    Serve's proxies get the balancer's request limits (``limits``, default ``ProxyLimits.from_env()``) when
    this call starts Serve; a Serve that already runs keeps the options it was started with.
    """
    from ray import serve

    args.validate()
    nodes = args.nodes or len(schedulable_nodes(args.replica_cpus))
    if nodes < 1:
        raise DeployError(f"no alive node of this Ray cluster has {args.replica_cpus} CPU free for a replica")
    limits = ProxyLimits.from_env() if limits is None else limits
    options: dict[str, Any] = {}
    if "controller_options" in inspect.signature(serve.start).parameters:  # Ray 2.60; not in 2.49
        # the proxies the controller creates inherit its environment: the limits' callback (limits.py)
        options["controller_options"] = {"runtime_env": {"env_vars": limits.proxy_env()}}
    else:
        progress(
            "warning: this Ray has no controller_options: Serve's proxies get the env's request limits only "
            "where every node's `ray start` had the variables of ProxyLimits.proxy_env() (docs/reliability.md)"
        )
    already = _serve_running()
    serve.start(proxy_location="EveryNode", http_options={"host": host, "port": port}, **options)
    _check_proxy_limits(limits, already, progress)
    running = serve.context._get_global_client().http_config
    if running.port != port:  # Serve was already running: it keeps its own options
        raise DeployError(
            f"Ray Serve already runs on this cluster with its proxies on port {running.port}, not {port}: "
            f"deploy with --port {running.port} (and AGENTRL_RAY_PORT={running.port} for the trainer), or "
            "`serve shutdown` first"
        )
    application = _serve_details().get("applications", {}).get(app_name, {})
    deployments = application.get("deployments", {})
    deployed = next((deployments[name] for name in (DEPLOYMENT_NAME, *OLD_DEPLOYMENT_NAMES) if name in deployments),
                    None)  # fmt: skip
    recorded = recorded_deployment(app_name) if deployed else None
    if recorded is not None and application.get("status") in ("RUNNING", "DEPLOYING"):
        recorded_args, recorded_nodes = recorded
        if if_missing:
            progress(f"{app_name!r} is deployed already: kept with its own arguments (--if-missing)")
            return recorded_nodes, recorded_args
        if recorded_args == args and recorded_nodes == nodes:
            progress(f"{app_name!r} is deployed with these arguments already: kept (no replica restarts)")
            return nodes, args
    if deployed and deployed["deployment_config"].get("max_replicas_per_node") != args.replicas_per_node:
        # Serve's rolling update starts the new replicas next to the old ones, and the per-node cap (of the old
        # and the new version together) would leave some of them unplaceable forever: replace the app instead
        # (clients retry across the gap; the trainer's retry budget is minutes).
        progress(f"replicas per node change: deleting {app_name!r} before deploying it again")
        serve.delete(app_name)
    serve.run(bind(args, nodes), name=app_name, route_prefix="/", blocking=False)
    _record_deployment(app_name, args, nodes)
    return nodes, args


_LIMITS_KEY = b"webshop-serve-proxy-limits"


def _check_proxy_limits(limits: ProxyLimits, already: bool, progress: Callable[[str], None]) -> None:
    """Record the limits Serve's proxies got when this call started Serve; when Serve ran already, say if its
    proxies lack them (started otherwise) or have others (its options are fixed until ``serve shutdown``)."""
    from ray.experimental import internal_kv

    wanted = json.dumps(limits.proxy_env(), sort_keys=True).encode()
    if not already:
        internal_kv._internal_kv_put(_LIMITS_KEY, wanted, overwrite=True, namespace=SECRET_KV_NAMESPACE)
        return
    recorded = internal_kv._internal_kv_get(_LIMITS_KEY, namespace=SECRET_KV_NAMESPACE)
    if recorded is None:
        progress(
            "warning: Ray Serve was started on this cluster without the env's request limits (header and body "
            "size and time, JSON errors; docs/reliability.md): `serve shutdown` and deploy again to get them"
        )
    elif recorded != wanted:
        progress(
            f"note: Serve's proxies keep the request limits they were started with ({recorded.decode()}); "
            "`serve shutdown` and deploy again to change them"
        )


def _serve_running() -> bool:
    """Whether this cluster already runs a Serve controller (its options are then fixed)."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        serve.context._get_global_client()
    except RayServeException:
        return False
    return True


def _serve_details() -> dict[str, Any]:
    """Serve's controller's view of the applications (what the dashboard shows; no dashboard needed)."""
    from ray import serve

    controller = serve.context._get_global_client()._controller
    return ray.get(controller.get_serve_instance_details.remote())


@ray.remote(num_cpus=0)
def _local_readyz(port: int) -> dict[str, Any]:
    """Ask this node's own proxy (loopback) whether the app answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return {"status": response.status, "body": json.loads(response.read())}
    except urllib.error.HTTPError as error:
        return {"status": error.code}
    except OSError as error:
        return {"status": None, "error": str(error)}


def replicas_by_node(
    app_name: str = DEFAULT_APP_NAME, details: dict[str, Any] | None = None
) -> dict[str, int]:
    """Node IP -> RUNNING replicas of the app (from Serve's controller)."""
    details = _serve_details() if details is None else details
    counts: dict[str, int] = {}
    for deployment in details.get("applications", {}).get(app_name, {}).get("deployments", {}).values():
        for replica in deployment.get("replicas", []):
            if replica.get("state") == "RUNNING" and replica.get("node_ip"):
                counts[replica["node_ip"]] = counts.get(replica["node_ip"], 0) + 1
    return counts


def wait_every_node(
    args: ServeArgs, app_name: str = DEFAULT_APP_NAME, port: int = DEFAULT_PORT, timeout: float = 300.0,
    progress: Callable[[str], None] = lambda message: None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Wait until every schedulable node runs its replicas and answers on its own proxy; returns per node
    ``{node_ip, url, replicas, fingerprint}``."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        nodes = schedulable_nodes(args.replica_cpus)
        details = _serve_details()
        counts = replicas_by_node(app_name, details)
        proxies = {p.get("node_ip"): p.get("status") for p in details.get("proxies", {}).values()}
        answers = ray.get([_on_node(_local_readyz, node["NodeID"]).remote(port) for node in nodes])
        report = [
            {
                "node_ip": node["NodeManagerAddress"],
                "url": f"http://{node['NodeManagerAddress']}:{port}",
                "replicas": counts.get(node["NodeManagerAddress"], 0),
                "fingerprint": (answer.get("body") or {}).get("fingerprint"),
                "readyz": answer.get("status"),
                "proxy": proxies.get(node["NodeManagerAddress"]),
            }
            for node, answer in zip(nodes, answers, strict=True)
        ]
        # the proxy's own status too: a proxy that could not bind the port is not HEALTHY, while another
        # process on that port (an older Serve, a stray server) might still answer /readyz
        waiting = [
            r for r in report
            if r["replicas"] < args.replicas_per_node or r["readyz"] != 200 or r["proxy"] != "HEALTHY"
        ]  # fmt: skip
        if nodes and not waiting:
            return report
        state = ", ".join(
            f"{r['node_ip']}: {r['replicas']} replica(s), proxy {r['proxy']}, readyz {r['readyz']}"
            for r in report
        )
        if state != last:
            progress(f"waiting for every node: {state or 'no node'}")
            last = state
        if time.monotonic() > deadline:
            raise DeployError(
                f"the WebShop app did not come up on every node within {timeout:.0f} s ({state}); see the "
                "replica logs (Ray's session logs, serve/ directory) and `serve status`"
            )
        time.sleep(1.0)


def undeploy(app_name: str = DEFAULT_APP_NAME) -> bool:
    """Delete the app (Serve itself keeps running for other apps); False when it was not deployed."""
    from ray import serve

    if app_name not in serve.status().applications:
        return False
    serve.delete(app_name)
    return True


def serve_config(
    args: ServeArgs,
    app_name: str = DEFAULT_APP_NAME,
    port: int = DEFAULT_PORT,
    limits: ProxyLimits | None = None,
) -> dict[str, Any]:
    """A Serve config file's content for ``serve deploy`` (the same app, the proxies' request limits; no secret
    in it)."""
    values = {key: value for key, value in args.as_dict().items() if value not in (None, {})}
    limits = ProxyLimits.from_env() if limits is None else limits
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": port},
        "controller_options": {"runtime_env": {"env_vars": limits.proxy_env()}},
        "applications": [
            {
                "name": app_name,
                "route_prefix": "/",
                "import_path": "agent_envs.ray_serve.app:build",
                "args": values,
            }
        ],
    }
