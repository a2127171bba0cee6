"""The settings' old names (``WEBSHOP_*``), kept for one release: a shell, a ``.env`` file or a Slurm script that
still sets them keeps working, with one deprecation line.

The service and the trainer serve and train every environment, so their settings are ``AGENTRL_*`` now
(``AGENTRL_ENVS``, ``AGENTRL_STATE_SECRET``, ``AGENTRL_URL``...). WebShop's own settings keep their names, as
SciWorld's ``SCIWORLD_*`` do: they are WebShop's (:data:`WEBSHOP_OWN`).

:func:`adopt_old_names` runs when ``agent_envs`` or ``agent_trainer`` is imported, before any setting is read: each
old name set whose new name is not becomes the new name, and the old one leaves the environment, so that the
processes this one starts see one name only (and print no second line). The Makefile (``mk/old-names.mk``), the
Slurm script and ``compose.yaml`` (``${AGENTRL_X:-${WEBSHOP_X:-default}}``) do the same in their languages.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

OLD_PREFIX = "WEBSHOP_"
NEW_PREFIX = "AGENTRL_"

#: WebShop's own settings: their names stay (they are not old names of anything).
WEBSHOP_OWN = frozenset({
    "WEBSHOP_CATALOG", "WEBSHOP_DEFAULT_GOAL_SET", "WEBSHOP_COMPAT_GOAL_SET", "WEBSHOP_MAX_STEPS",
    "WEBSHOP_MAX_BATCH", "WEBSHOP_SHOW_ATTRS", "WEBSHOP_SHIM_CATALOG", "WEBSHOP_NUMBA_CACHE_SEED",
    "WEBSHOP_BENCH_CACHE", "WEBSHOP_LUCENE_LARGE_RAW", "WEBSHOP_LUCENE_LARGE_CATALOG", "WEBSHOP_LUCENE_LARGE_QUERIES",
})  # fmt: skip


def new_name(old: str) -> str | None:
    """The name an old setting has now (``WEBSHOP_ENVS`` -> ``AGENTRL_ENVS``), else None (WebShop's own, or not
    an old name)."""
    if not old.startswith(OLD_PREFIX) or old in WEBSHOP_OWN or len(old) == len(OLD_PREFIX):
        return None
    return NEW_PREFIX + old[len(OLD_PREFIX) :]


def adopt_old_names(environ: MutableMapping[str, str] | None = None, *, say: bool = True) -> dict[str, str]:
    """Move every old-named setting in ``environ`` (default: this process's) to its new name, unless the new name
    is set too (then the new one wins and the old one is dropped). Returns {old: new} of those moved or dropped,
    and says so in one line on stderr (``say``)."""
    environ = os.environ if environ is None else environ
    moved: dict[str, str] = {}
    ignored: list[str] = []
    for old in [name for name in environ if name.startswith(OLD_PREFIX)]:
        new = new_name(old)
        if new is None:
            continue
        value = environ.pop(old)
        if new in environ:
            if environ[new] != value:
                ignored.append(old)
        else:
            environ[new] = value
        moved[old] = new
    if say and moved:
        renamed = ", ".join(f"{old} -> {new}" for old, new in sorted(moved.items()))
        line = f"deprecated setting names (they go in the next release): {renamed}"
        if ignored:
            line += f"; ignored, their new names are set too: {', '.join(sorted(ignored))}"
        print(f"agent-envs: {line}", file=sys.stderr)
    return moved
