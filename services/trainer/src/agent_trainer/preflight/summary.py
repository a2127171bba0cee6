"""Where a preflight run writes, and how it closes: its directory per verl line and its ``summary.json``."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import installed_verl_line


def line_dir(out_dir: Path) -> Path:
    """Where one verl line's preflight works and writes its summary: ``OUT/verl0.7`` or ``OUT/verl0.9``
    (the two lines' tiny models, data and summaries never overwrite each other)."""
    return out_dir.resolve() / f"verl{installed_verl_line()}"


def write_summary(summary: dict[str, Any], errors: list[str], checks: Mapping[str, bool], started: float,
                  out_dir: Path, top_dir: Path) -> dict[str, Any]:  # fmt: skip
    """Close a preflight run: its time, its verdict (no error, every check true, configs valid), and its
    ``summary.json`` in the run's folder (``OUT/verl0.7/webshop``), copied to ``top_dir``'s ``summary.json``
    (``OUT/summary.json``: the last run's, whichever line and environments, where ``make preflight`` says it is)."""
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary.setdefault("step_metrics_ok", False)
    summary["ok"] = not errors and all(checks.values()) and summary["config_valid"]
    text = json.dumps(summary, indent=2, default=str) + "\n"
    path = out_dir / "summary.json"
    path.write_text(text)
    top_dir.mkdir(parents=True, exist_ok=True)
    (top_dir / "summary.json").write_text(text)
    summary["summary_path"] = str(path)
    return summary


def rounded_mean(values: Sequence[float] | Mapping[Any, float]) -> float | None:
    """The mean to 4 decimals as the summary shows it; None for no values."""
    values = list(values)
    return round(sum(values) / len(values), 4) if values else None
