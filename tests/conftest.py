"""Shared fixtures: catalogs prepared once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/_agentgym.py

FIXTURES = Path(__file__).parent / "fixtures"
CONFORMANCE = FIXTURES / "conformance" / "original-seed3"


@pytest.fixture(scope="session")
def conformance_catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conformance raw data prepared with the reference run's prices, ceilings and title nouns pinned."""
    from webshop_env.catalog.prepare import Pins, prepare_catalog

    out = tmp_path_factory.mktemp("conformance") / "catalog"
    pins = Pins.from_files(
        prices=CONFORMANCE / "synthetic-goals" / "product_prices.json",
        title_nouns=CONFORMANCE / "synthetic-goals" / "title_nouns.json",
        goals={
            "synthetic": CONFORMANCE / "synthetic-goals" / "goals.json",
            "human": CONFORMANCE / "human-goals" / "goals.json",
        },
    )
    prepare_catalog(CONFORMANCE / "raw", out, num_products=1000, pins=pins, progress=False)
    return out


@pytest.fixture(scope="session")
def conformance_catalog(conformance_catalog_dir: Path):
    from webshop_env.catalog.store import open_catalog

    return open_catalog(conformance_catalog_dir)


@pytest.fixture(scope="session")
def generated_catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small bundled-generator catalog, prepared the way `make data` prepares the default one."""
    from webshop_env.catalog.generate import generate_catalog
    from webshop_env.catalog.prepare import prepare_catalog

    root = tmp_path_factory.mktemp("generated")
    generate_catalog(root / "raw", products=600, seed=7, progress=False)
    prepare_catalog(root / "raw", root / "catalog", progress=False)
    return root / "catalog"


@pytest.fixture(scope="session")
def generated_catalog(generated_catalog_dir: Path):
    from webshop_env.catalog.store import open_catalog

    return open_catalog(generated_catalog_dir)
