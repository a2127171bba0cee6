"""Where things are by default, in one place (the HTTP service's settings live in ``api.settings``)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CATALOG_DIR = Path("data/catalog")


def default_catalog_dir() -> Path:
    """``WEBSHOP_CATALOG`` or ``CATALOG_DIR`` from the environment, else ``data/catalog``."""
    value = os.environ.get("WEBSHOP_CATALOG") or os.environ.get("CATALOG_DIR")
    return Path(value) if value else DEFAULT_CATALOG_DIR
