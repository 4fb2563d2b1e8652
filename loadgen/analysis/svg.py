"""Tiny inline-SVG charts (no matplotlib: the HTML report must build anywhere and stay self-contained).

This module owns the SVG primitives (document, escaping, polyline and polygon, bars, axis labels,
legend); the report's charts below and the trace plot (``traces/render.py``) are drawn with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from html import escape

__all__ = [
    "COLORS",
    "bar",
    "bar_chart",
    "empty",
    "escape",
    "legend",
    "line_chart",
    "open_svg",
    "polygon",
    "polyline",
    "ticks",
    "timeline",
    "x_label",
    "y_axis",
]

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 300, 64, 150, 28, 40
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


# -- primitives ---------------------------------------------------------------------------------


def open_svg(width: float, height: float, font_size: int | None = None) -> str:
    """The opening ``<svg>`` tag of a standalone document ``width`` x ``height`` (sans-serif)."""
    size = f' font-size="{font_size}"' if font_size is not None else ""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif"{size}>'
    )


def _points(coords: Iterable[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)


def polyline(coords: Iterable[tuple[float, float]], color: str, width: float = 1.5) -> str:
    return f'<polyline fill="none" stroke="{color}" stroke-width="{width}" points="{_points(coords)}"/>'


def polygon(coords: Iterable[tuple[float, float]], fill: str, stroke: str, width: float = 1) -> str:
    return f'<polygon points="{_points(coords)}" fill="{fill}" stroke="{stroke}" stroke-width="{width}"/>'


def bar(x: float, y: float, width: float, height: float, fill: str, tip: str) -> str:
    """A filled rectangle whose tooltip is ``tip``."""
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" fill="{fill}">'
        f"<title>{escape(tip)}</title></rect>"
    )


def y_axis(
    values: Sequence[float],
    to_y: Callable[[float], float],
    x: float,
    *,
    grid_to: float | None = None,
    label: Callable[[float], str] | None = None,
    font_size: int | None = None,
) -> list[str]:
    """A label right-aligned left of ``x`` at each value, and a grid line from ``x`` to ``grid_to``
    (or, without it, a short tick mark left of ``x``)."""
    name = label or _fmt
    size = f' font-size="{font_size}"' if font_size is not None else ""
    out = []
    for v in values:
        y = to_y(v)
        if grid_to is not None:
            mark = f'<line x1="{x}" x2="{grid_to}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            out.append(f'<text x="{x - 4}" y="{y + 4:.1f}" text-anchor="end"{size}>{name(v)}</text>{mark}')
        else:
            mark = f'<line x1="{x - 4}" x2="{x}" y1="{y:.1f}" y2="{y:.1f}" stroke="#999"/>'
            out.append(f'{mark}<text x="{x - 6}" y="{y + 4:.1f}" text-anchor="end"{size}>{name(v)}</text>')
    return out


def x_label(x: float, y: float, text: str, font_size: int | None = None) -> str:
    """An axis label centred on ``x``."""
    size = f' font-size="{font_size}"' if font_size is not None else ""
    return f'<text x="{x:.1f}" y="{y}"{size} text-anchor="middle">{escape(text)}</text>'


def legend_entry(i: int, name: str, x: float, y0: float) -> str:
    """The ``i``-th legend line: ``name`` in the ``i``-th series colour."""
    return f'<text x="{x}" y="{y0 + 14 * (i + 1)}" fill="{COLORS[i % len(COLORS)]}">{escape(name)}</text>'


def legend(names: Iterable[str], x: float, y0: float) -> list[str]:
    return [legend_entry(i, name, x, y0) for i, name in enumerate(names)]


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"


# -- the report's charts ------------------------------------------------------------------------


def _frame(title: str, xlabel: str, ylabel: str) -> list[str]:
    return [
        open_svg(W, H, font_size=11),
        f'<text x="{PAD_L}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
        f'<text x="{(W - PAD_R + PAD_L) / 2}" y="{H - 6}" text-anchor="middle">{escape(xlabel)}</text>',
        f'<text x="12" y="{(H + PAD_T - PAD_B) / 2}" transform="rotate(-90 12 {(H + PAD_T - PAD_B) / 2})" '
        f'text-anchor="middle">{escape(ylabel)}</text>',
    ]


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

    def sx(x: float) -> float:
        return PAD_L + (fx(x) - x0) / (x1 - x0) * (W - PAD_L - PAD_R)

    def sy(y: float) -> float:
        return H - PAD_B - (y - y0) / (y1 - y0) * (H - PAD_T - PAD_B)

    out = _frame(title, xlabel, ylabel)
    out.append(
        f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" '
        'fill="none" stroke="#999"/>'
    )
    out += y_axis(ticks(y0, y1), sy, PAD_L, grid_to=W - PAD_R)
    for t in ticks(x0, x1):
        label = _fmt(10**t) if logx else _fmt(t)
        out.append(x_label(PAD_L + (t - x0) / (x1 - x0) * (W - PAD_L - PAD_R), H - PAD_B + 14, label))
    for i, (name, s) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        coords: list[tuple[float, float]] = []
        for j, (x, y) in enumerate(s):
            if step and j:
                coords.append((sx(x), sy(s[j - 1][1])))
            coords.append((sx(x), sy(y)))
        out.append(polyline(coords, color))
        if markers:
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in s]
        out.append(legend_entry(i, name, W - PAD_R + 8, PAD_T))
    return "\n".join([*out, "</svg>"])


def bar_chart(categories: list[str], series: dict[str, list[float | None]], title: str, ylabel: str) -> str:
    """Grouped bars: one group per category, one bar per series."""
    vals = [v for s in series.values() for v in s if v is not None]
    if not vals or not categories:
        return empty(title)
    y0, y1 = min(0.0, min(vals)), max(max(vals), 1e-9)
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def sy(y: float) -> float:
        return H - PAD_B - (y - y0) / (y1 - y0) * plot_h

    out = _frame(title, "", ylabel)
    group_w = plot_w / len(categories)
    bar_w = group_w * 0.8 / max(1, len(series))
    out += y_axis(ticks(y0, y1), sy, PAD_L, grid_to=W - PAD_R)
    for ci, cat in enumerate(categories):
        gx = PAD_L + ci * group_w + group_w * 0.1
        out.append(x_label(gx + group_w * 0.4, H - PAD_B + 14, cat))
        for si, (_, s) in enumerate(series.items()):
            v = s[ci]
            if v is None:
                continue
            top, bottom = sy(max(v, 0.0)), sy(min(v, 0.0))
            color = COLORS[si % len(COLORS)]
            out.append(
                bar(gx + si * bar_w, top, bar_w * 0.95, max(bottom - top, 0.5), color, f"{cat}: {_fmt(v)}")
            )
    out += legend(series, W - PAD_R + 8, PAD_T)
    return "\n".join([*out, "</svg>"])


def timeline(rows: dict[str, list[tuple[str, float, float]]], title: str) -> str:
    """Horizontal spans ``(name, start_s, duration_s)`` per labelled row (cold-start phases)."""
    spans = [s for r in rows.values() for s in r]
    if not spans:
        return empty(title)
    end = max(s + d for _, s, d in spans) or 1.0
    plot_w = W - PAD_L - PAD_R
    out = _frame(title, "seconds since process start", "")
    names: list[str] = []
    for ri, (label, r) in enumerate(rows.items()):
        y = PAD_T + 22 + ri * 56
        # Row label above its bar, phase names in a legend: short phases are too thin to label.
        out.append(f'<text x="{PAD_L}" y="{y - 4}">{escape(label)}</text>')
        for name, start, dur in r:
            if name not in names:
                names.append(name)
            x = PAD_L + start / end * plot_w
            color = COLORS[names.index(name) % len(COLORS)]
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{max(dur / end * plot_w, 1):.1f}" height="20" '
                f'fill="{color}"><title>{escape(name)}: {dur:.3f} s</title></rect>'
            )
        out.append(f'<text x="{PAD_L + plot_w + 4}" y="{y + 14}">{_fmt(sum(d for _, _, d in r))} s</text>')
    for i, name in enumerate(names):
        ly = PAD_T + 22 + len(rows) * 56 + i * 14
        out.append(
            f'<rect x="{PAD_L}" y="{ly - 9}" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>'
            f'<text x="{PAD_L + 14}" y="{ly}">{escape(name)}</text>'
        )
    out.append(f'<text x="{PAD_L}" y="{H - PAD_B + 14}">0</text>')
    out.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 14}" text-anchor="end">{_fmt(end)} s</text>')
    return "\n".join([*out, "</svg>"])


def empty(title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="60" font-family="sans-serif">'
        f'<text x="10" y="20" font-weight="bold">{escape(title)}</text>'
        '<text x="10" y="44">no data in this run</text></svg>'
    )
