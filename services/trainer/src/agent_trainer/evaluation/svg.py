"""Tiny inline-SVG charts (bars and lines), so reports stay self-contained and dependency-free."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

FONT = "font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif"
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _fmt(value: float) -> str:
    """A short axis label: 3 significant digits, thousands without exponent."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def nice_ticks(low: float, high: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering [low, high] (whole numbers only when ``integer``, e.g. training steps)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    if integer:
        raw = max(raw, 1.0)
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    start = math.floor(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    title: str,
    width: int = 460,
    height: int = 240,
    color: str = PALETTE[0],
    value_max: float | None = None,
    annotations: Sequence[str] | None = None,
    element_id: str | None = None,
) -> str:
    """Vertical bars with a y axis; ``annotations`` are drawn above the bars (e.g. counts)."""
    left, right, top, bottom = 40, 10, 28, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    top_value = value_max if value_max is not None else max([*values, 0.0])
    ticks = nice_ticks(0.0, top_value or 1.0, 4)
    y_max = ticks[-1]
    n = max(1, len(values))
    slot = plot_w / n
    bar_w = max(1.0, slot * 0.78)
    parts = [_open(width, height, title, element_id), _title(title, width)]
    for tick in ticks:
        y = top + plot_h - plot_h * tick / y_max
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        parts.append(_text(left - 4, y + 4, _fmt(tick), anchor="end", size=10, fill="#6b7280"))
    rotate = n > 8
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        x = left + i * slot + (slot - bar_w) / 2
        h = plot_h * max(0.0, value) / y_max
        y = top + plot_h - h
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="{color}">'
            f"<title>{escape(str(label))}: {escape(_fmt(value))}</title></rect>"
        )
        if annotations is not None and annotations[i]:
            parts.append(_text(x + bar_w / 2, y - 3, annotations[i], size=9, fill="#374151"))
        cx, cy = x + bar_w / 2, top + plot_h + 12
        if rotate:
            parts.append(
                f'<text x="{cx:.1f}" y="{cy:.1f}" font-size="9" fill="#374151" text-anchor="end" '
                f'transform="rotate(-40 {cx:.1f} {cy:.1f})" style="{FONT}">{escape(str(label))}</text>'
            )
        else:
            parts.append(_text(cx, cy, str(label), size=10, fill="#374151"))
    parts.append(
        f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#9ca3af"/>'
    )
    parts.append("</svg>")
    return "".join(parts)


def hbar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    title: str,
    width: int = 460,
    value_max: float = 1.0,
    annotations: Sequence[str] | None = None,
    color: str = PALETTE[2],
    element_id: str | None = None,
) -> str:
    """Horizontal bars (one row per label), for per-category rates."""
    left, right, top, row = 130, 96, 28, 22  # right: room for a note like "100.0 % of 1234"
    height = top + row * max(1, len(labels)) + 10
    plot_w = width - left - right
    parts = [_open(width, height, title, element_id), _title(title, width)]
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = top + i * row
        w = plot_w * max(0.0, min(value, value_max)) / (value_max or 1.0)
        short = label if len(label) <= 20 else label[:19] + "…"
        parts.append(_text(left - 6, y + 15, short, anchor="end", size=11, fill="#111827"))
        parts.append(f'<rect x="{left}" y="{y + 3}" width="{plot_w}" height="{row - 6}" fill="#f3f4f6"/>')
        parts.append(
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{color}">'
            f"<title>{escape(label)}: {escape(_fmt(value))}</title></rect>"
        )
        note = annotations[i] if annotations is not None else _fmt(value)
        parts.append(_text(left + plot_w + 6, y + 15, note, anchor="start", size=10, fill="#374151"))
    parts.append("</svg>")
    return "".join(parts)


def line_chart(
    series: Sequence[tuple[str, Sequence[float], Sequence[float]]],
    title: str,
    width: int = 460,
    height: int = 260,
    x_label: str = "step",
    element_id: str | None = None,
) -> str:
    """Lines over a shared x axis; ``series`` is ``[(name, xs, ys), ...]`` (non-finite points skipped)."""
    left, right, top, bottom = 52, 12, 28, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [(x, y) for _, xs, ys in series for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    parts = [_open(width, height, title, element_id), _title(title, width)]
    if not points:
        parts.append(_text(width / 2, height / 2, "no data", size=12, fill="#9ca3af"))
        parts.append("</svg>")
        return "".join(parts)
    integer = all(float(p[0]).is_integer() for p in points)
    x_ticks = nice_ticks(min(p[0] for p in points), max(p[0] for p in points), 5, integer=integer)
    y_ticks = nice_ticks(min(p[1] for p in points), max(p[1] for p in points), 4)
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + plot_w * (x - x0) / ((x1 - x0) or 1.0)

    def sy(y: float) -> float:
        return top + plot_h - plot_h * (y - y0) / ((y1 - y0) or 1.0)

    for tick in y_ticks:
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{sy(tick):.1f}" y2="{sy(tick):.1f}" '
            'stroke="#e5e7eb"/>'
        )
        parts.append(_text(left - 4, sy(tick) + 4, _fmt(tick), anchor="end", size=10, fill="#6b7280"))
    for tick in x_ticks:
        parts.append(_text(sx(tick), top + plot_h + 14, _fmt(tick), size=10, fill="#6b7280"))
    parts.append(_text(left + plot_w / 2, height - 6, x_label, size=10, fill="#6b7280"))
    for index, (name, xs, ys) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        coords = [f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
        if len(coords) == 1:
            cx, cy = coords[0].split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
        elif coords:
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{" ".join(coords)}"/>'
            )
        if len(series) > 1:
            parts.append(_text(left + 8 + 120 * index, top + 10, name, anchor="start", size=10, fill=color))
    parts.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#9ca3af"/>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _open(width: int, height: int, title: str, element_id: str | None) -> str:
    ident = f' id="{escape(element_id)}"' if element_id else ""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg"{ident} viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title)}">'
    )


def _title(title: str, width: int) -> str:
    return _text(width / 2, 16, title, size=13, fill="#111827", weight="600")


def _text(
    x: float,
    y: float,
    text: str,
    anchor: str = "middle",
    size: int = 11,
    fill: str = "#111827",
    weight: str = "400",
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-weight="{weight}" fill="{fill}" '
        f'text-anchor="{anchor}" style="{FONT}">{escape(text)}</text>'
    )
