"""Settings of the interaction, and where the repository's config files are.

The interaction's settings come from the ``config:`` mapping of ``configs/interaction.yaml`` (verl 0.7.1
passes that mapping, plus ``name``, to the constructor). Unknown keys are an error: a misspelled timeout must
not silently fall back to its default.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_ENV_URL = "http://127.0.0.1:36003"
INTERACTION_NAME = "webshop"
AGENT_NAME = "tool_agent"
# The WebShop agent loop (agent_loop.py), the only path on verl >= 0.8 (verl 0.8.0 removed interactions).
AGENT_LOOP_NAME = "webshop_agent"
#: New tokens per model turn, the same in training (both agent loops: ``turn_tokens`` in
#: configs/agent_loop.yaml) and in eval (``agent-train eval --max-tokens``); AGENTRL_TURN_TOKENS overrides.
TURN_TOKENS = 512


def turn_tokens() -> int:
    """The per-turn budget in force: AGENTRL_TURN_TOKENS, else :data:`TURN_TOKENS`."""
    value = os.environ.get("AGENTRL_TURN_TOKENS", "").strip()
    return int(value) if value else TURN_TOKENS


DATA_SOURCE = "webshop"
#: A training config's per-environment episode shape (top level, read by each environment's agent loop):
#: ``environments: {textcraft: {max_rounds: 30, turn_tokens: 512}, ...}``.
ENVIRONMENTS_KEY = "environments"
ENVIRONMENT_SETTINGS = ("max_rounds", "turn_tokens")


def default_env_url() -> str:
    """``AGENTRL_URL`` from the environment, else the local balancer's address."""
    return os.environ.get("AGENTRL_URL") or DEFAULT_ENV_URL


#: How the trainer reaches the env (``AGENTRL_ENV``): ``http`` (``env_url``: the balancer) or ``ray`` (the env as
#: a Ray Serve app on the training cluster: each process's own node's proxy, the other nodes' as fallbacks).
ENV_MODES = ("http", "ray")


def default_env_mode() -> str:
    """``AGENTRL_ENV`` from the environment, else ``http``."""
    return (os.environ.get("AGENTRL_ENV") or "http").strip().lower()


#: What a run's Ray workers must see on every node (``ray start`` workers inherit their node's environment, not
#: the launcher's): the project's settings (``AGENTRL_*``) and WebShop's own (``WEBSHOP_*``), where verl's
#: loggers write (its task runner is a Ray actor: without these its metrics go to a relative path on some node),
#: W&B and Hugging Face.
WORKER_SETTINGS = (
    "AGENTRL_",
    "WEBSHOP_",
    "VERL_FILE_LOGGER_PATH",
    "TENSORBOARD_DIR",
    "WANDB_",
    "HF_",
    "HUGGING_FACE_HUB_TOKEN",
)
#: Never forwarded to the workers: they do not need it, and a runtime environment is visible to the whole cluster.
PRIVATE_SETTINGS = frozenset({"AGENTRL_STATE_SECRET"})
#: A setting whose name has one of these words (``WANDB_API_KEY``, ``HF_TOKEN``) is a secret: it never goes into
#: a Hydra override, a config, a Ray runtime environment (Ray's runtime_env_agent.log prints those whole) or a log;
#: the launcher hands it to the workers in a file only they read (:mod:`agent_trainer.worker_secrets`).
SECRET_NAME_WORDS = frozenset({"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS"})


def is_secret(name: str) -> bool:
    """Whether a setting's name marks it as a secret (a word of :data:`SECRET_NAME_WORDS`, ``_``-separated)."""
    return not SECRET_NAME_WORDS.isdisjoint(name.upper().split("_"))


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The settings a run's Ray workers get on every node through their runtime environment
    (``WORKER_SETTINGS``, less ``PRIVATE_SETTINGS`` and secrets)."""
    return {k: env[k] for k in sorted(env)
            if k.startswith(WORKER_SETTINGS) and k not in PRIVATE_SETTINGS and not is_secret(k)}  # fmt: skip


def worker_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """The secret settings among ``WORKER_SETTINGS`` (less ``PRIVATE_SETTINGS``): forwarded in a file, never in
    the runtime environment."""
    return {k: env[k] for k in sorted(env)
            if k.startswith(WORKER_SETTINGS) and k not in PRIVATE_SETTINGS and is_secret(k) and env[k]}  # fmt: skip


@dataclass(frozen=True)
class InteractionSettings:
    """What ``WebshopInteraction`` reads from its config (all optional).

    Attributes:
        env: ``http`` (reach the env at ``env_url``) or ``ray`` (this node's Ray Serve proxy,
            ``http://127.0.0.1:<ray_port>``, then the other nodes'); default ``$AGENTRL_ENV`` or ``http``.
        env_url: the balancer (or one replica); default ``$AGENTRL_URL`` or ``http://127.0.0.1:36003``.
        ray_port: the Serve proxies' port with ``env: ray`` (None: ``$AGENTRL_RAY_PORT`` or 36080).
        goal_set: goal list used when a row names none (None: the server's default).
        timeout: seconds per HTTP attempt.
        retries: at most this many attempts after the first on connection errors, timeouts and 5xx
            (None: as many as ``retry_budget_s`` allows).
        retry_budget_s: seconds after the first attempt during which failed requests are retried, so a run
            rides out a balancer or replica restart; then the step raises with what failed last.
        backoff: base of the exponential backoff between attempts, in seconds.
        max_backoff: cap of one backoff sleep.
        max_connections: HTTP connection pool of the process (shared by all trajectories).
        ready_timeout: seconds to wait for the service at the first episode of a process (0: do not wait,
            fail at the first request instead).
        state_ttl_s: an episode untouched this long is dropped (trajectories that verl stops on a turn or
            length limit never report their end).
        invalid_action_penalty: subtracted from the turn reward of a reply with no parseable action.
        max_observation_chars: cut longer pages (0: never).
        on_env_error: ``terminate`` ends a trajectory whose episode the server refuses (4xx: expired or
            foreign state) with reward 0; ``raise`` raises. Unreachable servers always raise after retries.
    """

    env_url: str = dataclasses.field(default_factory=default_env_url)
    env: str = dataclasses.field(default_factory=default_env_mode)
    ray_port: int | None = None
    goal_set: str | None = None
    timeout: float = 10.0
    retries: int | None = None
    retry_budget_s: float = 60.0
    backoff: float = 0.2
    max_backoff: float = 5.0
    max_connections: int = 512
    ready_timeout: float = 120.0
    state_ttl_s: float = 1800.0
    invalid_action_penalty: float = 0.0
    max_observation_chars: int = 0
    on_env_error: str = "terminate"

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> InteractionSettings:
        """Build from the interaction config; ``name`` (added by verl) is ignored, other unknown keys raise."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in config.items() if k != "name"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown WebshopInteraction setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        for key in ("env_url", "env"):
            if values.get(key) in (None, ""):
                values.pop(key, None)
        settings = cls(**values)
        if settings.env not in ENV_MODES:
            raise ValueError(f"env (AGENTRL_ENV) must be one of {', '.join(ENV_MODES)}, not {settings.env!r}")
        if settings.on_env_error not in ("terminate", "raise"):
            raise ValueError(f"on_env_error must be 'terminate' or 'raise', not {settings.on_env_error!r}")
        if settings.state_ttl_s <= 0:
            raise ValueError("state_ttl_s must be positive")
        return settings


def repo_root() -> Path | None:
    """The checkout this package is installed from (editable install), if any."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "configs").is_dir() and (parent / "services").is_dir():
            return parent
    return None


def config_dir() -> Path:
    """``AGENTRL_CONFIG_DIR``, else ``configs/`` of the checkout, else ``./configs``."""
    if os.environ.get("AGENTRL_CONFIG_DIR"):
        return Path(os.environ["AGENTRL_CONFIG_DIR"]).resolve()
    root = repo_root()
    return (root / "configs") if root else (Path.cwd() / "configs").resolve()


TRAINING_CONFIGS = {"test": "webshop_grpo_test", "full": "webshop_grpo_train"}


def training_config_name(config: str) -> str:
    """``test``/``full`` (WebShop's two runs) or a config file's own name (``textcraft_grpo_test``, ...)."""
    return TRAINING_CONFIGS.get(config, config)


INTERACTION_CONFIG = "interaction.yaml"
AGENT_LOOP_CONFIG = "agent_loop.yaml"
#: Their old names (links to them in configs/, for one release), and where a training config names them.
OLD_CONFIG_FILES = {
    "webshop_interaction.yaml": INTERACTION_CONFIG,
    "webshop_agent_loop.yaml": AGENT_LOOP_CONFIG,
}
CONFIG_FILE_KEYS = (
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path",
)


def old_config_file_notes(config: Any) -> list[str]:
    """A deprecation line for each config file a composed training config names by its old name (an override or
    an ``AGENTRL_*_CONFIG`` setting from before the rename; the old names are links to the new files)."""
    from omegaconf import OmegaConf

    notes = []
    for key in CONFIG_FILE_KEYS:
        try:
            path = OmegaConf.select(config, key)
        except Exception:  # an interpolation that does not resolve here: the preflight names it
            continue
        new = OLD_CONFIG_FILES.get(Path(str(path)).name) if path else None
        if new:
            notes.append(
                f"{key}={path}: a deprecated file name (it goes in the next release): use {new} beside it"
            )
    return notes


# The verl 0.9.1 line's training configs (configs/verl09/; same hyper-parameters as TRAINING_CONFIGS).
VERL09_CONFIG_SUBDIR = "verl09"
VERL_LINES = ("0.7", "0.9")


def installed_verl_line() -> str:
    """``"0.7"`` (verl 0.7.x: interactions exist) or ``"0.9"`` (verl >= 0.8: agent loop only) for this Python."""
    from importlib.metadata import version

    major, minor = (int(part) for part in version("verl").split(".")[:2])
    return "0.7" if (major, minor) < (0, 8) else "0.9"


def training_config_dir(line: str | None = None) -> Path:
    """Where the training configs of a verl line live: ``configs/`` (0.7) or ``configs/verl09/`` (0.9).

    ``line`` defaults to the installed verl's line, so ``agent-train train`` picks the right files in either
    environment (``.venv`` / ``.venv-verl09``, or either trainer image).
    """
    line = line or installed_verl_line()
    if line not in VERL_LINES:
        raise ValueError(f"unknown verl line {line!r}; expected one of {', '.join(VERL_LINES)}")
    return config_dir() / VERL09_CONFIG_SUBDIR if line == "0.9" else config_dir()


#: Where a line's shared settings live, under its training config directory: ``base/grpo_test.yaml`` (every test
#: run's) and ``base/grpo_train.yaml`` (every full run's); each ``<env>_grpo_{test,train}.yaml`` is an overlay on one
#: of them (Hydra's ``defaults: [base/grpo_test, _self_]``).
BASE_CONFIG_SUBDIR = "base"


def training_config_file(name: str, line: str | None = None, directory: Path | None = None) -> Path:
    """The file of the training config ``name`` (``test``/``full`` or a config's own name) in ``directory``, else
    in the training config directory of ``line`` (default: the installed verl's)."""
    return (directory or training_config_dir(line)) / f"{training_config_name(name)}.yaml"


def training_config_names(directory: Path) -> list[str]:
    """The training configs of a directory (``<env>_grpo_test``, ``mixed_grpo_train``, ...), sorted."""
    return sorted(p.stem for p in directory.glob("*_grpo_*.yaml"))


def load_training_config(
    name: str,
    line: str | None = None,
    overrides: Sequence[str] = (),
    *,
    directory: Path | None = None,
    with_verl: bool = True,
    resolve: bool = False,
) -> Any:
    """The training config ``name`` (``test``/``full`` or a config's own name) as Hydra composes it for verl's
    ``main_ppo``: the environment's file over its base (``base/grpo_{test,train}.yaml``) over verl's own
    ``ppo_trainer`` config, then ``overrides`` (Hydra's syntax). The one way this package reads a training config:
    never the YAML of one file, which holds only an environment's differences.

    ``line``: the verl line whose configs (``configs/`` or ``configs/verl09/``, :func:`training_config_dir`);
    default the installed verl's. ``directory``: that directory itself (a copy of the configs, a test's).
    ``with_verl=False``: verl's ``ppo_trainer`` is replaced by an empty config, so the result holds exactly what the
    project's files set (and verl's defaults are absent): no verl needed, and either line's files compose in any
    environment (the checks of the files themselves, the host's tools). With verl, ``line`` must be the installed
    one (the other line's files would be composed against the wrong ``ppo_trainer``).
    ``resolve``: interpolations resolved (``${oc.env:...}`` from this process's environment); by default they stay,
    as ``main_ppo`` receives them. Raises FileNotFoundError naming the directory's configs when there is none.
    """
    import tempfile

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    if with_verl and line is not None and directory is None and line != installed_verl_line():
        raise ValueError(
            f"the verl {line} line's configs compose against verl {line}'s ppo_trainer, and verl "
            f"{installed_verl_line()} is installed here: use that line's environment, or with_verl=False"
        )
    folder = (directory or training_config_dir(line)).resolve()
    file = training_config_file(name, directory=folder)
    if not file.is_file():
        raise FileNotFoundError(
            f"no training config {file} (there: test, full or one of {', '.join(training_config_names(folder))})"
        )
    with tempfile.TemporaryDirectory(prefix="no-verl-") as stub:
        extra = []
        if (
            not with_verl
        ):  # an empty ppo_trainer, found first: the primary config's own search path is replaced
            (Path(stub) / "ppo_trainer.yaml").write_text("")
            extra = [f"hydra.searchpath=[file://{stub}]"]
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            config = compose(config_name=file.stem, overrides=[*extra, *overrides])
    if resolve:
        OmegaConf.resolve(config)
    return config
