"""WebShop: find and buy the product a shopping instruction describes, in a simulated web shop (the original's
text mode, 1.18M products or a generated catalog). See docs/environments/webshop.md.

The package: the simulator (``core``: a pure function of (state, action)), its Lucene-exact search (``search``), the
prepared catalog every replica memory-maps (``catalog``), the recorder and checker of episodes against the original
(``conformance``); ``textenv.WebShopTextEnv``, the simulator behind the environment contract; and ``http``, WebShop's
own protocol over HTTP (its native ``/v1`` routes with goal sets, splits and batches, and AgentGym's WebShop routes),
which the serving layer mounts at the root and under ``/webshop`` as its registration asks (``envs.registry``).

Nothing is imported here beyond what a caller asks for: ``import agent_envs.envs.webshop.core.env`` does not open a
catalog or load numba.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .textenv import WebShopTextEnv


def make(settings: Any = None) -> WebShopTextEnv:
    """WebShop over the prepared catalog the service's settings name (``WEBSHOP_CATALOG``, goal sets, step limit,
    ``show_attrs``; from the environment when ``settings`` is None). Each call opens the catalog (memory-mapped)."""
    from .catalog.store import open_catalog
    from .textenv import WebShopTextEnv

    if settings is None:
        from ...api.settings import Settings

        settings = Settings()
    return WebShopTextEnv(
        open_catalog(settings.catalog), default_goal_set=settings.default_goal_set,
        compat_goal_set=settings.compat_goal_set, max_steps=settings.max_steps, show_attrs=settings.show_attrs,
    )  # fmt: skip


def check(settings: Any) -> list[str]:
    """What stops ``serve`` before a worker starts: no prepared catalog at ``settings.catalog``."""
    from .catalog.store import CatalogError, open_catalog

    try:
        open_catalog(settings.catalog)  # the workers open their own
    except CatalogError as error:
        return [str(error)]
    return []
