"""What a preflight run is asked to do: ``agent-train preflight``'s options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import default_env_url

#: The environment a preflight plays when none is named (``agent-train preflight`` without ``--env``).
DEFAULT_ENV = "webshop"


@dataclass
class PreflightOptions:
    """What ``agent-train preflight`` runs (the defaults keep it under ~2 minutes on 2 cores)."""

    config: str | None = None  # "test" | "full" | None (check both; roll out with "test")
    catalog: Path | None = None
    out_dir: Path = Path("outputs/preflight")
    env_url: str | None = None  # reuse this service (default: $AGENTRL_URL or the local balancer's address)
    fresh_cluster: bool = False  # never reuse: always start (and stop) a cluster of our own
    goal_set: str = "synthetic"
    goals: int = 4
    rollouts: int = 2
    # verl's max_assistant_turns for the rollouts: max_turns - 1 env steps (8: plans of up to 7 actions, every
    # plan length of the bundled catalog)
    max_turns: int = 8
    max_new_tokens: int = 24
    replicas: int = 2
    config_dir: Path | None = None
    extra_overrides: list[str] = field(default_factory=list)
    # the training run's own Hydra overrides (compose: TRAIN_EXTRA_ARGS): checked with the configs, and applied
    # to the rollout config before the preflight's small sizes
    overrides: list[str] = field(default_factory=list)
    # the environments (``--env textcraft`` or a mix): their configs, data, cluster and agent loop; None: WebShop
    envs: list[str] | None = None

    @property
    def env_ids(self) -> list[str]:
        """The environments the run plays: ``envs``, else WebShop (the preflight's default)."""
        return list(self.envs or [DEFAULT_ENV])

    @property
    def run_folder(self) -> str:
        """The run's folder under the line's, whichever environments it plays: ``webshop``, ``textcraft+webshop``
        (one layout for every run, so no two runs' data, cluster records or summaries overwrite each other)."""
        return "+".join(self.env_ids)

    def reuse_url(self) -> str | None:
        """The env service to reuse if it serves the run's environments (on its catalog): none with
        ``fresh_cluster``, else ``env_url``, ``$AGENTRL_URL`` or the local balancer's address."""
        return None if self.fresh_cluster else (self.env_url or default_env_url())
