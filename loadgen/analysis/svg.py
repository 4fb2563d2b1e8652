"""Tiny inline-SVG charts (no matplotlib: the HTML report must build anywhere and stay self-contained)."""

from __future__ import annotations

import math
from html import escape

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 300, 64, 150, 28, 40
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
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


def _frame(title: str, xlabel: str, ylabel: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        f'font-family="sans-serif" font-size="11">',
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
    for t in _ticks(y0, y1):
        out.append(
            f'<text x="{PAD_L - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
        )
    for t in _ticks(x0, x1):
        label = _fmt(10**t) if logx else _fmt(t)
        xp = PAD_L + (t - x0) / (x1 - x0) * (W - PAD_L - PAD_R)
        out.append(f'<text x="{xp:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{label}</text>')
    for i, (name, s) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        coords: list[str] = []
        for j, (x, y) in enumerate(s):
            if step and j:
                coords.append(f"{sx(x):.1f},{sy(s[j - 1][1]):.1f}")
            coords.append(f"{sx(x):.1f},{sy(y):.1f}")
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(coords)}"/>')
        if markers:
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in s]
        out.append(
            f'<text x="{W - PAD_R + 8}" y="{PAD_T + 14 * (i + 1)}" fill="{color}">{escape(name)}</text>'
        )
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
    for t in _ticks(y0, y1):
        out.append(
            f'<text x="{PAD_L - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
        )
    for ci, cat in enumerate(categories):
        gx = PAD_L + ci * group_w + group_w * 0.1
        out.append(
            f'<text x="{gx + group_w * 0.4:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">'
            f"{escape(cat)}</text>"
        )
        for si, (_, s) in enumerate(series.items()):
            v = s[ci]
            if v is None:
                continue
            top, bottom = sy(max(v, 0.0)), sy(min(v, 0.0))
            out.append(
                f'<rect x="{gx + si * bar_w:.1f}" y="{top:.1f}" width="{bar_w * 0.95:.1f}" '
                f'height="{max(bottom - top, 0.5):.1f}" fill="{COLORS[si % len(COLORS)]}">'
                f"<title>{escape(cat)}: {_fmt(v)}</title></rect>"
            )
    for si, name in enumerate(series):
        out.append(
            f'<text x="{W - PAD_R + 8}" y="{PAD_T + 14 * (si + 1)}" fill="{COLORS[si % len(COLORS)]}">'
            f"{escape(name)}</text>"
        )
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
