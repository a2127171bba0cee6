"""Tests of the verl 0.9 line: they run in .venv-verl09 (`make test` runs `.venv-verl09/bin/pytest tests/trainer/verl09`).

In .venv (verl 0.7.1) they are skipped: the two verl lines cannot share one environment (numpy<2 vs >=2).
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("verl")
    except PackageNotFoundError:
        installed = None
    if installed is not None and not installed.startswith("0.7"):
        return
    skip = pytest.mark.skip(
        reason=f"verl 0.9 line only (installed: verl {installed}); run .venv-verl09/bin/pytest"
    )
    for item in items:
        if "verl09" in item.path.parts:
            item.add_marker(skip)
