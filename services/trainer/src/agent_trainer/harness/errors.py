"""What the harness raises when it cannot give a run what it asked for."""

from __future__ import annotations


class HarnessError(RuntimeError):
    """The local harness could not provide a run's piece (a cluster that did not start, too few solvable tasks);
    the message says which and why."""
