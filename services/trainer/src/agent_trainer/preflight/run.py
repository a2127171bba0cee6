"""``agent-train preflight``: one route for any environment or a mix, WebShop alone included, on the installed verl
line.

Every run: the environments' training configs through Hydra and verl's checks, the catalog and the tiny model, a
cluster serving the environments, then the stages of :mod:`.envs` (each environment's oracle tasks picked through its
spec, their rows as ``agent-train data --env`` writes them, the agent loops with the tiny model and the scripted
oracle, on verl 0.7.1 the interaction route too, the state and leak checks) and ``summary.json``. One layout too:
``OUT/verl<line>/<env>+<env>/summary.json``, the last run's copied to ``OUT/summary.json``.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

from ..config import installed_verl_line, training_config_dir
from ..harness.catalog import default_catalog
from ..harness.cluster import Cluster, start_or_reuse_env_cluster
from .configs import agent_loop_file, check_training_configs, interaction_file, preflight_configs
from .envs import run_env_stages
from .options import PreflightOptions
from .summary import line_dir, write_summary


def run_preflight(options: PreflightOptions) -> dict[str, Any]:
    """Run every step; returns the summary (``ok`` False and ``errors`` filled when a check failed)."""
    from importlib.metadata import version

    from agent_envs.envs.webshop.catalog.store import open_catalog

    from ..tiny_model import build_tiny_model

    started = time.monotonic()
    env_ids = options.env_ids
    out_dir = line_dir(options.out_dir) / options.run_folder
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"ok": False, "verl_version": version("verl"), "verl_line": installed_verl_line(),
                               "envs": env_ids, "config_valid": False, "rollouts": 0, "mean_reward": None,
                               "oracle_mean_reward": None, "leaked_states": None, "token_stream_ok": False,
                               "errors": [], "checks": {}, "timings": {}}  # fmt: skip
    errors: list[str] = summary["errors"]
    checks: dict[str, bool] = summary["checks"]
    cluster: Cluster | None = None
    directory = (options.config_dir or training_config_dir()).resolve()
    since = [time.monotonic()]

    def lap(name: str) -> None:
        """The time since the last lap, as ``timings[name]``."""
        now = time.monotonic()
        summary["timings"][name] = round(now - since[0], 2)
        since[0] = now

    try:
        # the configs name the interaction and agent-loop files relative to the repository: found from anywhere
        os.environ.setdefault("AGENTRL_INTERACTION_CONFIG", str(interaction_file(directory)))
        os.environ.setdefault("AGENTRL_AGENT_LOOP_CONFIG", str(agent_loop_file()))
        configs = preflight_configs(env_ids, options.config)
        check_training_configs(configs, options.overrides, directory, summary, errors)
        config_name = next(iter(configs.values()))
        lap("configs")

        catalog_dir = (options.catalog or default_catalog(out_dir)).resolve()
        catalog = open_catalog(catalog_dir)
        summary["catalog"] = {"dir": str(catalog_dir), "fingerprint": catalog.fingerprint}
        model_dir = build_tiny_model(line_dir(options.out_dir) / "tiny_model", catalog_dir)
        lap("model")

        cluster = start_or_reuse_env_cluster(catalog_dir, catalog.fingerprint, env_ids, out_dir / "cluster",
                                             options.reuse_url(), options.replicas)  # fmt: skip
        os.environ["AGENTRL_URL"] = cluster.url  # the configs read ${oc.env:AGENTRL_URL}
        summary["cluster"] = {"url": cluster.url, "reused": cluster.reused}
        lap("cluster")

        run_env_stages(
            options, directory, config_name, out_dir, catalog, model_dir, cluster.url, summary, lap
        )
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
        summary["traceback"] = traceback.format_exc(limit=8)
    finally:
        if cluster is not None and cluster.stop is not None:
            cluster.stop()
    return write_summary(summary, errors, checks, started, out_dir, options.out_dir.resolve())
