"""``agent-train report --run outputs/<experiment>``: training curves from verl's metric log.

Sources, searched under the run directory (first match wins per step and key; JSON files first, then by name):
- verl's ``file`` logger (``trainer.logger=[console,file]``, path from ``VERL_FILE_LOGGER_PATH``;
  ``agent-train train`` points it at ``<run>/metrics/metrics.jsonl``): JSON lines
  ``{"step": N, "data": {"actor/pg_loss": ...}}``;
  flat ``{"step": N, "<key>": number, ...}`` lines work too;
- verl's console logger output captured in a log file: lines ``step:N - key:value - key:value ...``.

Panels (each plots every key matching one of its patterns, up to ``MAX_SERIES``): reward, success, KL,
policy loss, response length, env steps per episode, invalid-action rate. Writes ``curves.png`` (matplotlib, when installed) and
``curves.html`` (self-contained, inline SVG) into ``--out`` (default ``<run>/report``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from .svg import line_chart

MAX_SERIES = 4
LOG_SUFFIXES = (".jsonl", ".json", ".log", ".txt", ".out")
# checkpoints, our own output, binary/remote logger folders, and verl's generation dumps (JSON lines with a
# "step" and a "score" per sample, which would read as metrics)
SKIP_DIRS = {
    "checkpoints",
    "report",
    "tensorboard",
    "tensorboard_log",
    "wandb",
    "validation",
    "rollouts",
    "rollout",
}
_CONSOLE = re.compile(r"(?:^|\s)step:(\d+)\s+-\s+(.*)")


@dataclass(frozen=True)
class Panel:
    title: str
    patterns: tuple[str, ...]  # regexes, in order of preference; every matching key becomes a series
    y_label: str = ""


PANELS: tuple[Panel, ...] = (
    Panel(
        "Reward",
        (
            r"^critic/score/mean$",
            r"^critic/rewards/mean$",
            r"^val-core/.*/(reward|score|acc)/mean@\d+$",
            r"(^|/)reward(/mean)?$",
        ),
    ),
    Panel("Success rate", (r"^[^/]+/success/mean$", r"^val-aux/.*/success/mean@\d+$", r"success(_rate)?$")),
    Panel("KL", (r"^actor/kl_loss$", r"^actor/ppo_kl$", r"^algorithm/kl$")),
    Panel("Policy loss", (r"^actor/pg_loss$", r"^actor/policy_loss$")),
    Panel("Response length", (r"^response_length/mean$", r"^response/length/mean$")),
    # per training step from agent_trainer.verl_main (<env>/<key>/mean), per validation from verl (val-aux)
    Panel(
        "Env steps per episode",
        (r"^[^/]+/steps/mean$", r"^val-aux/.*/steps/mean@\d+$", r"^num_turns/mean$"),
    ),
    Panel("Invalid-action rate", (r"^[^/]+/invalid_rate/mean$", r"^val-aux/.*/invalid_rate/mean@\d+$")),
)


@dataclass
class MetricLog:
    """``{key: {step: value}}`` gathered from every metric file of a run."""

    series: dict[str, dict[int, float]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def add(self, step: int, data: Mapping[str, Any]) -> None:
        for key, value in data.items():
            number = _number(value)
            if number is not None:
                self.series.setdefault(str(key), {}).setdefault(step, number)

    def points(self, key: str) -> tuple[list[float], list[float]]:
        steps = sorted(self.series[key])
        return [float(s) for s in steps], [self.series[key][s] for s in steps]

    def matching(self, panel: Panel) -> list[str]:
        keys: list[str] = []
        for pattern in panel.patterns:
            regex = re.compile(pattern)
            keys += sorted(k for k in self.series if regex.search(k) and k not in keys)
        return keys[:MAX_SERIES]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def metric_files(run: Path) -> list[Path]:
    """Candidate metric files under ``run`` (checkpoints, wandb and our own report are left out)."""
    if run.is_file():
        return [run]
    found = [
        path
        for path in run.rglob("*")
        if path.is_file()
        and path.suffix in LOG_SUFFIXES
        and not SKIP_DIRS & set(path.relative_to(run).parts[:-1])
    ]
    # structured logs (full precision) before console captures (rounded), then by path
    return sorted(found, key=lambda path: (path.suffix not in (".jsonl", ".json"), str(path)))


def read_metric_log(run: Path | str) -> MetricLog:
    """Everything that looks like a verl metric record under ``run``."""
    log = MetricLog()
    for path in metric_files(Path(run)):
        before = sum(len(v) for v in log.series.values())
        _read_file(path, log)
        if sum(len(v) for v in log.series.values()) > before:
            log.sources.append(str(path))
    return log


def _read_file(path: Path, log: MetricLog) -> None:
    try:
        lines: Iterable[str] = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or "step" not in record:
                continue
            step = _number(record["step"])
            if step is None:
                continue
            if isinstance(record.get("data"), dict):  # verl's file logger: {"step": N, "data": {...}}
                data = record["data"]
            else:  # a flat record counts only when every value is a number (not a generation dump)
                data = {k: v for k, v in record.items() if k != "step"}
                if not data or any(isinstance(v, str) or _number(v) is None for v in data.values()):
                    continue
            log.add(int(step), data)
            continue
        match = _CONSOLE.search(line)
        if match:
            pairs = (item.rpartition(":") for item in match.group(2).split(" - "))
            log.add(
                int(match.group(1)), {key.strip(): value.strip() for key, _, value in pairs if key.strip()}
            )


# ---- outputs ----------------------------------------------------------------------------------------------
@dataclass
class CurvesResult:
    html: Path
    png: Path | None
    panels: dict[str, list[str]]  # panel title -> keys plotted
    sources: list[str]
    note: str = ""


def write_curves(run: Path | str, out: Path | str | None = None, title: str | None = None) -> CurvesResult:
    """Read the run's metric log, write ``curves.html`` (+ ``curves.png``); raises when there is none."""
    run = Path(run)
    if not run.exists():
        raise FileNotFoundError(f"{run} does not exist (expected outputs/<experiment> of a training run)")
    log = read_metric_log(run)
    if not log.series:
        raise FileNotFoundError(
            f"no verl metrics under {run}: run training with trainer.logger=[console,file] and "
            "VERL_FILE_LOGGER_PATH=<run>/metrics/metrics.jsonl (or keep the console output in <run>/logs/)"
        )
    out = Path(out) if out else (run if run.is_dir() else run.parent) / "report"
    out.mkdir(parents=True, exist_ok=True)
    panels = {panel.title: log.matching(panel) for panel in PANELS}
    title = title or f"Training curves: {run.resolve().name}"
    html_path = out / "curves.html"
    html_path.write_text(_html(log, panels, title), encoding="utf-8")
    png_path, note = _png(log, panels, title, out / "curves.png")
    return CurvesResult(html=html_path, png=png_path, panels=panels, sources=log.sources, note=note)


def _html(log: MetricLog, panels: Mapping[str, Sequence[str]], title: str) -> str:
    charts = []
    for name, keys in panels.items():
        series = [(key, *log.points(key)) for key in keys]
        charts.append(line_chart(series, name, element_id="curve-" + re.sub(r"\W+", "-", name.lower())))
    rows = []
    for key in sorted(log.series):
        xs, ys = log.points(key)
        rows.append(
            f"<tr><td>{escape(key)}</td><td>{len(xs)}</td><td>{int(xs[-1])}</td><td>{ys[-1]:.6g}</td></tr>"
        )
    sources = "".join(f"<li>{escape(s)}</li>" for s in log.sources)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>
body{{font:14px/1.45 system-ui,sans-serif;margin:0;color:#111827;background:#f9fafb}}
header{{background:#111827;color:#fff;padding:14px 24px}}h1{{font-size:20px;margin:0}}
main{{padding:16px 24px}}
section{{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:14px 18px;margin:0 0 16px}}
.charts{{display:flex;flex-wrap:wrap;gap:18px}}td,th{{padding:2px 14px 2px 0;text-align:left}}
</style></head><body><header><h1>{escape(title)}</h1></header><main>
<section><div class="charts">{"".join(charts)}</div></section>
<section><h2>Last values</h2><table>
<tr><th>metric</th><th>points</th><th>last step</th><th>last value</th></tr>
{"".join(rows)}</table></section>
<section><h2>Sources</h2><ul>{sources}</ul></section></main></body></html>
"""


def _png(
    log: MetricLog, panels: Mapping[str, Sequence[str]], title: str, path: Path
) -> tuple[Path | None, str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed: wrote curves.html only (pip install matplotlib for PNG)"
    columns = 3
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
    for axis, (name, keys) in zip(axes.flat, panels.items(), strict=False):
        for key in keys:
            xs, ys = log.points(key)
            axis.plot(xs, ys, label=key, linewidth=1.5, marker="o" if len(xs) == 1 else None)
        axis.set_title(name)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        if keys:
            axis.legend(fontsize=7)
        else:
            axis.text(
                0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes, color="#9ca3af"
            )
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path, ""
