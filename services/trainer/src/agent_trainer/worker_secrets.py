"""Secrets (``WANDB_API_KEY``, ``HF_TOKEN``, ...) for a run's Ray workers, without a command line, a config or a log.

Why: workers started by ``ray start`` inherit their node's environment, not the launcher's, so the launcher
forwards its settings through verl's ``ray_kwargs.ray_init.runtime_env``. That road is wrong for secrets: the
overrides are printed (the launcher, Hydra's ``.hydra/overrides.yaml``), verl prints its ``ray init kwargs`` and
the whole config and hands the config to ``wandb.init(config=...)``, and Ray's ``runtime_env_agent.log`` prints
every runtime environment it releases. So the launcher writes the secrets into a file only the run's user can
read (mode 0600, in a 0700 directory of the run's own, on the shared filesystem of a Slurm job) and removes it
when verl exits; the runtime environment carries the file's *path* (:data:`SECRETS_FILE_ENV`) and Ray's
``worker_process_setup_hook`` (:func:`setup`), which loads the file into each worker's environment before the
worker runs anything. A hook the run was given already is chained (:data:`CHAINED_HOOK_ENV`).

A node that cannot read the file (no shared filesystem) keeps its own environment: the Slurm script's ``srun``
passes the job's environment, secrets included, to every node's ``ray start``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The runtime environment's variable naming the secrets file (a path: not a secret).
SECRETS_FILE_ENV = "AGENTRL_WORKER_SECRETS_FILE"
#: A ``worker_process_setup_hook`` the run was given (the rehearsal's CPU seams): :func:`setup` runs it after.
CHAINED_HOOK_ENV = "AGENTRL_WORKER_SETUP_HOOK"
HOOK = f"{__name__}.setup"
_HOOK_KEY = "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"
_ENV_VARS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars."


def secrets_path(run_dir: Path) -> Path:
    """Where a run's secrets file lives while verl runs: ``<run>/.secrets/worker-env.json``."""
    return run_dir / ".secrets" / "worker-env.json"


def write_secrets(path: Path, values: Mapping[str, str]) -> Path:
    """Write ``values`` (JSON) to ``path``, readable by this user only; the directory is made 0700."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # an older file keeps its mode through O_CREAT
        json.dump(dict(values), out)
    return path


def remove_secrets(path: Path) -> None:
    """Remove the secrets file and its directory (when empty)."""
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # something else in it: left alone
        path.parent.rmdir()


def given_secret_overrides(overrides: Sequence[str]) -> list[str]:
    """The keys of overrides that would put a secret into the config: an environment variable with a secret's
    name (``...env_vars.WANDB_API_KEY=...``; config keys are lower case, ``trainer.no_such_key`` is none)."""
    from .config import is_secret

    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    return [key for key in keys if (name := key.rsplit(".", 1)[-1]).isupper() and is_secret(name)]


def hook_overrides(overrides: Sequence[str], path: Path) -> list[str]:
    """``overrides`` with the run's setup hook replaced by :func:`setup` (the old one chained) and the file's path
    in the workers' runtime environment."""
    kept: list[str] = []
    chained = None
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == _HOOK_KEY:
            chained = value.strip().strip("'\"") or None
        else:
            kept.append(override)
    added = [f"++{_HOOK_KEY}={HOOK}", f"++{_ENV_VARS_KEY}{SECRETS_FILE_ENV}='{path}'"]
    if chained and chained != HOOK:
        added.append(f"++{_ENV_VARS_KEY}{CHAINED_HOOK_ENV}={chained}")
    return added + kept


def load_secrets(path: str | os.PathLike[str] | None) -> list[str]:
    """Put the file's settings into this process's environment; returns their names (never their values)."""
    if not path:
        return []
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        print(f"agent_trainer.worker_secrets: cannot read {path} ({type(error).__name__}); this worker keeps "
              "its node's own environment", file=sys.stderr)  # fmt: skip
        return []
    for key, value in values.items():
        os.environ[str(key)] = str(value)
    return sorted(values)


def setup() -> None:
    """Ray's ``worker_process_setup_hook``: the run's secrets, then the hook the run was given (if any)."""
    load_secrets(os.environ.get(SECRETS_FILE_ENV))
    chained = os.environ.get(CHAINED_HOOK_ENV)
    if chained:
        import importlib

        module, _, name = chained.rpartition(".")
        getattr(importlib.import_module(module), name)()
