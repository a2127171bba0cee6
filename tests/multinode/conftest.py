"""Multi-node tests on one machine: test hosts are network namespaces (``_netns``), and a real Slurm cluster
runs across them (``_slurm``). Need root and ``ip``; the Slurm tests also need ``make slurm`` (Debian's
slurm-wlm and munge). Each skips with the reason where that is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # from _netns import ..., from _slurm import ...


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """``item.rep_setup``/``rep_call``/``rep_teardown``: fixtures see whether the test failed."""
    outcome = yield
    setattr(item, f"rep_{call.when}", outcome.get_result())


def pytest_terminal_summary(terminalreporter) -> None:
    import _raynodes

    if _raynodes.FIGURES:
        terminalreporter.section("multi-node figures")
        for line in _raynodes.FIGURES:
            terminalreporter.write_line(line)
