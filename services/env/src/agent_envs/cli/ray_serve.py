"""``agent-envs serve-ray``: deploy the env as a Ray Serve app on a running Ray cluster (or take it down)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from ..ray_serve import DEFAULT_APP_NAME, DEFAULT_PORT
from ..ray_serve.nodes import serve_port

EPILOG = """\
Examples:
  ray start --head && agent-envs serve-ray --catalog /shared/webshop/catalog
  agent-envs serve-ray --envs textcraft,babyai                    # no WebShop: no catalog needed
  agent-envs serve-ray --catalog data/catalog --stage-catalog     # copy it to every node's local disk
  agent-envs serve-ray --write-config webshop-serve.yaml          # for `serve deploy webshop-serve.yaml`
  agent-envs serve-ray --down

Every node of the cluster then serves the env on its own Serve proxy: a process on a node reaches it at
http://127.0.0.1:PORT (the trainer does, with AGENTRL_ENV=ray). The state secret is AGENTRL_STATE_SECRET, or
--state-secret-file, or the one this cluster already has, or a new random one; it is kept in the cluster's
key-value store, never in the Serve config. AgentGym sessions need a Redis every node reaches (--redis-url).
"""


def _progress(message: str) -> None:
    print(f"serve-ray: {message}", file=sys.stderr, flush=True)


def cmd_serve_ray(args: argparse.Namespace) -> int:
    from ..api.settings import SettingsError, secret_problem
    from ..ray_serve import deploy
    from ..ray_serve.app import ServeArgs

    settings: dict[str, Any] = {}
    if args.redis_url:
        settings["redis_url"] = args.redis_url
    if args.envs:
        settings["envs"] = args.envs
    for item in args.setting or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"agent-envs serve-ray: error: --setting expects NAME=VALUE, got {item!r}")
        settings[key.strip().lower()] = value
    secret = os.environ.get("AGENTRL_STATE_SECRET") or None
    if secret is not None and (problem := secret_problem(secret)) is not None:
        raise SettingsError(f"AGENTRL_STATE_SECRET is not a usable secret: {problem}")
    if args.state_secret_file is not None:
        secret = None  # the replicas read the file themselves
    try:
        if args.write_config and not args.stage_catalog and args.state_secret_file is not None:
            # a file for `serve deploy`, with nothing to put into a cluster first
            serve_args = ServeArgs.parse(_serve_args(args, _catalog(args), settings))
            _write_config(args.write_config, deploy.serve_config(serve_args, args.app_name, args.port))
            return 0
        deploy.connect(args.address)
        if args.wait_nodes:
            deploy.wait_nodes(args.wait_nodes, args.wait, progress=_progress)
        if args.down:
            removed = deploy.undeploy(args.app_name)
            _print({"app": args.app_name, "removed": removed})
            return 0
        if args.state_secret_file is None:
            _progress(f"state secret: {deploy.store_state_secret(secret)} (in the cluster's key-value store)")
        catalog = _catalog(args)
        if args.stage_catalog:
            if catalog is None:
                raise ValueError("--stage-catalog copies a catalog: give --catalog (or WEBSHOP_CATALOG)")
            catalog, outcome = deploy.stage_catalog(Path(catalog), args.stage_root, progress=_progress)
            _progress(f"catalog at {catalog} on every node: {outcome}")
        serve_args = ServeArgs.parse(_serve_args(args, catalog, settings))
        if args.write_config:
            _write_config(args.write_config, deploy.serve_config(serve_args, args.app_name, args.port))
            return 0
        nodes, serve_args = deploy.deploy(
            serve_args, args.app_name, args.port, args.host, progress=_progress, if_missing=args.if_missing
        )
        _progress(
            f"deployed {args.app_name!r}: {serve_args.replicas_per_node} replica(s) on each of {nodes} node(s)"
        )
        report = deploy.wait_every_node(serve_args, args.app_name, args.port, args.wait, progress=_progress)
    except (deploy.DeployError, ValueError, SettingsError) as error:
        print(f"agent-envs serve-ray: error: {error}", file=sys.stderr)
        return 1
    _print({"app": args.app_name, "local_url": f"http://127.0.0.1:{args.port}", "nodes": report})
    return 0


def _catalog(args: argparse.Namespace) -> str | None:
    """WebShop's catalog for the replicas: the one given (``--catalog``, ``WEBSHOP_CATALOG``, ``CATALOG_DIR``: a path
    on every node, maybe not on this machine), else ``data/catalog`` where this machine has one; None: the
    replicas' default, which an app without WebShop never opens (and where WebShop is served, each replica's start
    check names what is missing)."""
    given = args.catalog or os.environ.get("WEBSHOP_CATALOG") or os.environ.get("CATALOG_DIR")
    if given:
        return str(Path(given).resolve())
    default = Path("data/catalog")
    return str(default.resolve()) if default.is_dir() else None


def _serve_args(args: argparse.Namespace, catalog: str | None, settings: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {
        "catalog": catalog,
        "replicas_per_node": args.replicas_per_node,
        "replica_cpus": args.replica_cpus,
        "settings": settings,
    }
    if args.state_secret_file is not None:
        values["state_secret_file"] = str(args.state_secret_file.resolve())
    return values


def _write_config(path: Path, config: dict[str, Any]) -> None:
    import yaml

    path.write_text(yaml.safe_dump(config, sort_keys=False))
    _progress(
        f"wrote {path}: `serve deploy {path}` deploys it (its replicas read the secret from the cluster)"
    )


def _print(value: object) -> None:
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()


def add_commands(subparsers: Any) -> None:
    """Add ``serve-ray`` to the ``agent-envs`` sub-command parser."""
    p = subparsers.add_parser(
        "serve-ray",
        help="deploy the env as a Ray Serve app on a running Ray cluster: replicas and a proxy on every node",
        description="Deploy the env service as a Ray Serve application on a running Ray cluster: "
        "REPLICAS replicas and Serve's HTTP proxy on every node, requests kept on the node's own replicas. "
        "Waits until every node answers on its own proxy, then prints one JSON line with the per-node URLs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--address", default=os.environ.get("RAY_ADDRESS") or "auto",
        help="the Ray cluster (default: $RAY_ADDRESS or auto: the cluster this machine is part of)",
    )  # fmt: skip
    p.add_argument(
        "--catalog", type=Path, default=None,
        help="where WebShop is served: its prepared catalog directory, at this path on every node (a shared "
        "filesystem) unless --stage-catalog (default: $WEBSHOP_CATALOG, $CATALOG_DIR, or data/catalog where it "
        "exists; an app without WebShop needs none)",
    )  # fmt: skip
    p.add_argument(
        "--stage-catalog", action="store_true",
        help="copy the catalog from this machine to every node's local disk first (Ray tasks, one per node; "
        "skipped where the same catalog is already there)",
    )  # fmt: skip
    p.add_argument(
        "--stage-root", default="/tmp/webshop-catalog",
        help="with --stage-catalog: the copy goes to STAGE_ROOT/<fingerprint> on every node (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--replicas-per-node", type=int, default=int(os.environ.get("AGENTRL_RAY_REPLICAS_PER_NODE", 1)),
        help="replicas on each node (default: $AGENTRL_RAY_REPLICAS_PER_NODE or 1)",
    )  # fmt: skip
    p.add_argument(
        "--replica-cpus", type=float, default=float(os.environ.get("AGENTRL_RAY_REPLICA_CPUS", 0.25)),
        help="Ray CPUs each replica reserves (default: $AGENTRL_RAY_REPLICA_CPUS or 0.25)",
    )  # fmt: skip
    p.add_argument(
        "--port", type=int, default=serve_port(),
        help=f"Serve's HTTP proxy port on every node (default: $AGENTRL_RAY_PORT or {DEFAULT_PORT})",
    )  # fmt: skip
    p.add_argument("--host", default="0.0.0.0", help="the proxies' bind address (default: %(default)s)")
    p.add_argument(
        "--app-name", default=DEFAULT_APP_NAME, help="Serve application name (default: %(default)s)"
    )
    p.add_argument(
        "--state-secret-file", type=Path, default=None,
        help="the replicas read the state secret from this file (same path on every node) instead of the "
        "cluster's key-value store",
    )  # fmt: skip
    p.add_argument(
        "--redis-url", default=os.environ.get("AGENTRL_REDIS_URL") or None,
        help="Redis for the AgentGym endpoints' sessions, reachable from every node (default: $AGENTRL_REDIS_URL)",
    )  # fmt: skip
    p.add_argument(
        "--if-missing", action="store_true",
        help="keep an app that is deployed already, whatever its arguments (the training launcher uses this, so "
        "a by-hand deployment keeps its replicas and catalog); without it, an app deployed with other arguments "
        "is deployed again (the same arguments: kept, no restart)",
    )  # fmt: skip
    p.add_argument(
        "--envs", default=os.environ.get("AGENTRL_ENVS") or None,
        help="environments every replica serves (webshop, textcraft, babyai, sciworld; default: $AGENTRL_ENVS or "
        "webshop); the others under /<env> on every node's proxy",
    )  # fmt: skip
    p.add_argument(
        "--setting", action="append", metavar="NAME=VALUE",
        help="another service setting for every replica (e.g. max_steps=50; see `agent-envs serve --help`)",
    )  # fmt: skip
    p.add_argument("--wait", type=float, default=300.0, help="seconds to wait for every node (default: 300)")
    p.add_argument(
        "--wait-nodes", type=int, default=0, metavar="N",
        help="first wait until the cluster has N alive nodes (a job script starting its nodes; default: no wait)",
    )  # fmt: skip
    p.add_argument(
        "--write-config", type=Path, default=None,
        help="write a Serve config file for `serve deploy` instead of deploying (with --stage-catalog: after "
        "staging)",
    )  # fmt: skip
    p.add_argument("--down", action="store_true", help="delete the app from the cluster instead")
    p.set_defaults(func=cmd_serve_ray)
