"""The HTTP service's settings, read from ``AGENTRL_*`` environment variables (WebShop's own: ``WEBSHOP_*``), or
passed in by tests.

Every uvicorn worker process builds its own ``Settings`` from the environment, so ``agent-envs serve``
exports what it was given on the command line before it starts the workers.

State secret policy: all replicas of one deployment must share ``AGENTRL_STATE_SECRET`` (any replica must
accept any other replica's tokens). Without it the service refuses to start, unless
``AGENTRL_ALLOW_EPHEMERAL_SECRET=1`` says a random per-process secret is acceptable (one replica with one
worker, a demo, a test); then it logs a loud warning, because such tokens die with the process and are
rejected by every other replica or worker. ``agent-envs serve`` draws one ephemeral secret for all of its
workers, so a single multi-worker replica still works.
"""

from __future__ import annotations

import collections
import logging
import math
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..setting_aliases import NEW_PREFIX, WEBSHOP_OWN
from ..settings import default_catalog_dir

log = logging.getLogger("agent_envs.api")

MIN_SECRET_CHARS = 16
MIN_SECRET_BITS = 64.0
GENERATE_SECRET = "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"


def estimated_entropy_bits(value: str) -> float:
    """Shannon entropy of the characters times the length: 0 for "aaaa...", ~5.9 bits/char for urlsafe tokens.

    An upper bound on the real entropy (it cannot see dictionary words), but it rejects what a typo or a
    placeholder produces: repeated characters, short alphabets, short strings.
    """
    if not value:
        return 0.0
    counts = collections.Counter(value)
    total = len(value)
    per_char = max(0.0, -sum(n / total * math.log2(n / total) for n in counts.values()))
    return per_char * total


def secret_problem(value: str) -> str | None:
    """Why ``value`` is not acceptable as AGENTRL_STATE_SECRET, or None."""
    if len(value) < MIN_SECRET_CHARS:
        return f"it is too short ({len(value)} characters; at least {MIN_SECRET_CHARS})"
    bits = estimated_entropy_bits(value)
    if bits < MIN_SECRET_BITS or len(set(value)) < 8:
        return (
            f"it is too predictable (about {bits:.0f} bits of entropy, {len(set(value))} distinct characters; "
            f"at least {MIN_SECRET_BITS:.0f} bits and 8 distinct characters)"
        )
    return None


def _webshop(field: str) -> str:
    """The variable of one of WebShop's own settings (its name stays ``WEBSHOP_*``)."""
    name = f"WEBSHOP_{field.upper()}"
    assert name in WEBSHOP_OWN, name
    return name


class SettingsError(ValueError):
    """The settings cannot make a working service; the message says which variable to set."""


class Settings(BaseSettings):
    """Service configuration. Environment variables: the field name upper-cased with an ``AGENTRL_`` prefix;
    WebShop's own settings with ``WEBSHOP_`` (:data:`agent_envs.setting_aliases.WEBSHOP_OWN`)."""

    model_config = SettingsConfigDict(
        env_prefix=NEW_PREFIX, extra="ignore", frozen=True, populate_by_name=True
    )

    envs: str = Field(
        default="webshop",
        description="comma-separated environments this replica serves (any registered one: webshop, textcraft, "
        "babyai, sciworld, and installed plugins); each is served under /<env> (WebShop's also at the root)",
    )
    # WebShop's settings (its package reads them: envs.webshop.make)
    catalog: Path = Field(
        validation_alias=_webshop("catalog"),
        default_factory=default_catalog_dir,
        description="prepared catalog directory",
    )
    state_secret: SecretStr | None = Field(default=None, description="HMAC key for state tokens (shared)")
    allow_ephemeral_secret: bool = Field(default=False, description="accept a random per-process secret")
    default_goal_set: str = Field(
        validation_alias=_webshop("default_goal_set"),
        default="synthetic",
        description="goal set when a request names none",
    )
    compat_goal_set: str = Field(
        validation_alias=_webshop("compat_goal_set"),
        default="synthetic",
        description="goal set of the AgentGym endpoints",
    )
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, description="request bodies above this get 413")
    compat_max_sessions: int = Field(
        default=20_000, ge=1,
        description="live AgentGym sessions per environment in the store (per process with no Redis); when "
        "full, /create evicts the session idle the longest. About 2 kB each in Redis (more for a long SciWorld "
        "episode): 20,000 of each environment fit the store's 512 MB",
    )  # fmt: skip
    compat_client_max_sessions: int = Field(
        default=4096, ge=1, description="live AgentGym sessions per client address (Redis store)"
    )
    redis_url: str | None = Field(
        default=None, description="Redis holding the AgentGym sessions of every replica and worker"
    )
    compat_idle_ttl_s: float = Field(
        default=0.0, ge=0,
        description="idle AgentGym sessions expire after this many seconds; 0 (the default): never, as on "
        "AgentGym's own servers (the session cap bounds memory instead)",
    )  # fmt: skip
    max_steps: int = Field(
        validation_alias=_webshop("max_steps"),
        default=100,
        ge=0,
        description="steps per episode before truncation (0: none)",
    )
    max_batch: int = Field(
        validation_alias=_webshop("max_batch"),
        default=256,
        ge=1,
        description="most steps in one /v1/step_batch request",
    )
    show_attrs: bool = Field(
        validation_alias=_webshop("show_attrs"),
        default=False,
        description="offer the item page's Attributes button",
    )
    log_level: str = Field(default="INFO", description="Python log level name")
    log_format: Literal["json", "text"] = Field(
        default="json", description="one JSON object per line, or text"
    )
    access_log: bool = Field(default=True, description="access log lines (off: none at all)")
    access_log_every: int = Field(
        default=100, ge=1,
        description="log one in N successful (< 400), fast requests; every error and every request slower "
        "than access_log_slow_ms is always logged (1: every request). The metrics count every request.",
    )  # fmt: skip
    access_log_slow_ms: float = Field(
        default=500.0, ge=0, description="requests at least this slow are always logged"
    )

    def __init__(self, **values: Any) -> None:
        # a WebShop setting passed by its field name (Settings(catalog=...)) under its variable's name, or the
        # variable, if set, would win over it (pydantic-settings merges the sources by key)
        names = {name: field.validation_alias for name, field in type(self).model_fields.items()}
        super().__init__(**{(names.get(key) or key): value for key, value in values.items()})

    @field_validator("envs")
    @classmethod
    def _known_envs(cls, value: str) -> str:
        from ..envs.registry import ids

        names = [name.strip().lower() for name in value.split(",") if name.strip()]
        known = ids()
        unknown = [name for name in names if name not in known]
        if not names or unknown:
            raise ValueError(f"unknown environment(s) {unknown or value!r}: choose from {', '.join(known)}")
        return ",".join(dict.fromkeys(names))

    def env_ids(self) -> list[str]:
        """The enabled environments, in the order given (duplicates removed)."""
        return self.envs.split(",")

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        name = value.upper()
        if not isinstance(logging.getLevelName(name), int):
            raise ValueError(f"unknown log level {value!r}; use DEBUG, INFO, WARNING or ERROR")
        return name

    def secret_bytes(self) -> bytes:
        """The state secret to sign tokens with (see the module docstring for the policy)."""
        if self.state_secret is not None:
            value = self.state_secret.get_secret_value()
            problem = secret_problem(value)
            if problem is not None:
                raise SettingsError(
                    f"AGENTRL_STATE_SECRET is not a usable secret: {problem}. Anyone who guesses it can forge "
                    f"state tokens; generate one with {GENERATE_SECRET} (`make up` writes one into .env)"
                )
            return value.encode()
        if not self.allow_ephemeral_secret:
            raise SettingsError(
                "AGENTRL_STATE_SECRET is not set: every replica of a deployment must share one secret to "
                "accept each other's state tokens. Set it (e.g. `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`), or set AGENTRL_ALLOW_EPHEMERAL_SECRET=1 to use a random "
                "secret that only this process knows (one replica, one worker)."
            )
        log.warning(
            "AGENTRL_STATE_SECRET is not set: using a random EPHEMERAL secret. State tokens from this process "
            "will be rejected by every other replica or worker and become invalid on restart. Set "
            "AGENTRL_STATE_SECRET for any deployment with more than one process."
        )
        return secrets.token_bytes(32)
