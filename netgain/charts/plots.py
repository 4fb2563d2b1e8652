"""The HTML report's charts: lines over a shared x axis, grouped bars and a phase timeline, drawn
with the SVG primitives of ``svg.py``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from netgain.charts.svg import (
    COLORS,
    FONT,
    LINE,
    MARGIN,
    PLOT_H,
    Frame,
    W,
    bar,
    empty,
    escape,
    fit,
    fmt_value,
    log_ticks,
    polyline,
    svg_text,
    text_width,
    ticks,
    value_ticks,
    x_label,
    y_axis,
)

__all__ = ["bar_chart", "line_chart", "timeline"]


def _spread(positions: Sequence[float], labels: Sequence[str], gap: float = 8.0) -> bool:
    """Whether labels centred on ascending ``positions`` keep ``gap`` px between neighbours."""
    for i in range(1, len(positions)):
        need = (text_width(labels[i - 1]) + text_width(labels[i])) / 2 + gap
        if positions[i] - positions[i - 1] < need:
            return False
    return True


def line_chart(
    series: dict[str, list[list[float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    step: bool = False,
    markers: bool = False,
) -> str:
    """One polyline per named series of [x, y] points; ``logx`` for latency CDFs with long tails."""
    pts = [(x, y) for s in series.values() for x, y in s if x is not None and y is not None]
    if not pts:
        return empty(title)

    def fx(x: float) -> float:
        return math.log10(max(x, 1e-9)) if logx else x

    xs, ys = [fx(p[0]) for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(0.0, min(ys)), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    yt, y1 = value_ticks(y0, y1)

    def xname(t: float) -> str:
        return fmt_value(10**t) if logx else fmt_value(t)

    # x ticks: as many as fit without their labels touching
    xt: list[float] = []
    fr = Frame(title, xlabel, ylabel, y_labels=[fmt_value(v) for v in yt])
    for n in (6, 5, 4, 3, 2):
        xt = log_ticks(x0, x1, n) if logx else ticks(x0, x1, n)
        reserve = max(text_width(xname(t)) for t in xt) / 2 + 2
        fr = Frame(title, xlabel, ylabel, y_labels=[fmt_value(v) for v in yt], x_reserve=reserve)
        pos = [fr.left + (t - x0) / (x1 - x0) * fr.width for t in xt]
        if _spread(pos, [xname(t) for t in xt]):
            break
    else:
        xt = [x0, x1]

    def px(t: float) -> float:  # t already on the axis' scale (log10 for logx)
        return fr.left + (t - x0) / (x1 - x0) * fr.width

    def sx(x: float) -> float:
        return px(fx(x))

    def sy(y: float) -> float:
        return fr.bottom - (y - y0) / (y1 - y0) * PLOT_H

    out = [*fr.head(), fr.box()]
    out += y_axis(yt, sy, fr.left, grid_to=fr.right)
    row = fr.tick_row()
    out += [x_label(px(t), row, xname(t)) for t in xt]
    for i, s in enumerate(series.values()):
        color = COLORS[i % len(COLORS)]
        coords: list[tuple[float, float]] = []
        for j, (x, y) in enumerate(s):
            if step and j:
                coords.append((sx(x), sy(s[j - 1][1])))
            coords.append((sx(x), sy(y)))
        out.append(polyline(coords, color))
        if markers:
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in s]
    foot, height = fr.foot(row, list(series))
    return fr.finish(out + foot, height)


def bar_chart(categories: list[str], series: dict[str, list[float | None]], title: str, ylabel: str) -> str:
    """Grouped bars: one group per category, one bar per series."""
    vals = [v for s in series.values() for v in s if v is not None]
    if not vals or not categories:
        return empty(title)
    y0, y1 = min(0.0, min(vals)), max(max(vals), 1e-9)
    yt, y1 = value_ticks(y0, y1)
    fr = Frame(title, "", ylabel, y_labels=[fmt_value(v) for v in yt])

    def sy(y: float) -> float:
        return fr.bottom - (y - y0) / (y1 - y0) * PLOT_H

    out = [*fr.head(), fr.box("#eee")]
    group_w = fr.width / len(categories)
    bar_w = group_w * 0.8 / max(1, len(series))
    out += y_axis(yt, sy, fr.left, grid_to=fr.right)
    # category labels: one row if they fit their group, else alternate between two rows, else shortened
    widest = max(text_width(c) for c in categories)
    rows = 1 if widest <= group_w - 6 or len(categories) == 1 else 2
    room = group_w - 6 if rows == 1 else 2 * group_w - 8
    row = fr.tick_row()
    for ci, cat in enumerate(categories):
        gx = fr.left + ci * group_w + group_w * 0.1
        label = fit(cat, room)
        out.append(
            svg_text(
                gx + group_w * 0.4, row + (ci % rows) * LINE, label, anchor="middle", full=cat, cls="xtick"
            )
        )
        for si, s in enumerate(series.values()):
            v = s[ci]
            if v is None:
                continue
            top, bottom = sy(max(v, 0.0)), sy(min(v, 0.0))
            color = COLORS[si % len(COLORS)]
            out.append(
                bar(
                    gx + si * bar_w,
                    top,
                    bar_w * 0.95,
                    max(bottom - top, 0.5),
                    color,
                    f"{cat}: {fmt_value(v)}",
                )
            )
    foot, height = fr.foot(row + (rows - 1) * LINE, list(series), swatch="box")
    return fr.finish(out + foot, height)


def timeline(rows: dict[str, list[tuple[str, float, float]]], title: str) -> str:
    """Horizontal spans ``(name, start_s, duration_s)`` per labelled row (cold-start phases)."""
    spans = [s for r in rows.values() for s in r]
    if not spans:
        return empty(title)
    end = max(s + d for _, s, d in spans) or 1.0
    totals = [f"{fmt_value(sum(d for _, _, d in r))} s" for r in rows.values()]
    end_label = f"{fmt_value(end)} s"
    fr = Frame(title, "seconds since process start", "")
    fr.right = W - MARGIN - max(text_width(t) for t in [*totals, end_label]) - 6
    plot_w = fr.width
    out = fr.head()
    names: list[str] = []
    y = fr.top
    for (label, r), total in zip(rows.items(), totals, strict=True):
        # Row label above its bar, phase names in a legend: short phases are too thin to label.
        out.append(svg_text(fr.left, y + FONT, fit(label, plot_w), full=label, cls="rowlabel"))
        bar_y = y + LINE + 2
        for name, start, dur in r:
            if name not in names:
                names.append(name)
            x = fr.left + start / end * plot_w
            color = COLORS[names.index(name) % len(COLORS)]
            out.append(
                f'<rect x="{x:.1f}" y="{bar_y:.1f}" width="{max(dur / end * plot_w, 1):.1f}" height="20" '
                f'fill="{color}"><title>{escape(name)}: {dur:.3f} s</title></rect>'
            )
        out.append(svg_text(fr.right + 6, bar_y + 14, total))
        y = bar_y + 20 + 10
    out.append(f'<line x1="{fr.left:.1f}" x2="{fr.right:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#999"/>')
    row = y + 4 + FONT
    out.append(svg_text(fr.left, row, "0"))
    out.append(svg_text(fr.right, row, end_label, anchor="end"))
    foot, height = fr.foot(row, names, swatch="box")
    return fr.finish(out + foot, height)
