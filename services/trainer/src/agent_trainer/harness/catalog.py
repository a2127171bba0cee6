"""The WebShop catalog a CPU run serves when it is given none."""

from __future__ import annotations

import sys
from pathlib import Path


def default_catalog(out_dir: Path) -> Path:
    """The configured catalog if it exists, else a small generated one under ``out_dir`` (built once)."""
    from agent_envs.settings import default_catalog_dir

    configured = default_catalog_dir()
    if (configured / "manifest.json").exists():
        return configured
    target = out_dir / "catalog"
    if not (target / "manifest.json").exists():
        from agent_envs.envs.webshop.catalog.generate import generate_catalog
        from agent_envs.envs.webshop.catalog.prepare import prepare_catalog

        print(f"preflight: no catalog at {configured}; generating a small one in {target}", file=sys.stderr)
        generate_catalog(out_dir / "raw", products=600, seed=7, progress=False)
        prepare_catalog(out_dir / "raw", target, progress=False)
    return target
