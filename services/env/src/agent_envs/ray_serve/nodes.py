"""Where a client on a Ray node finds the env: its own node's Serve proxy first, then the other nodes'.

Used by the trainer with ``AGENTRL_ENV=ray``: its agent-loop workers are Ray actors, so they ask the cluster
they run in; a process that is not connected to Ray gets only its own node's proxy.
"""

from __future__ import annotations

import os

from . import DEFAULT_PORT


def serve_port() -> int:
    """The Serve proxy port: ``AGENTRL_RAY_PORT``, else :data:`DEFAULT_PORT`."""
    value = os.environ.get("AGENTRL_RAY_PORT", "").strip()
    return int(value) if value else DEFAULT_PORT


def node_proxy_urls(port: int | None = None) -> list[str]:
    """``http://127.0.0.1:<port>`` (this node's proxy), then every other alive node's proxy by its IP."""
    port = serve_port() if port is None else port
    urls = [f"http://127.0.0.1:{port}"]
    try:
        import ray
    except ImportError:
        return urls
    if not ray.is_initialized():
        return urls
    own = ray.util.get_node_ip_address()
    others = sorted(
        {node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")} - {own, "127.0.0.1"}
    )
    return urls + [f"http://{ip}:{port}" for ip in others]
