"""Tiny inline-SVG charts (no matplotlib: the HTML report must build anywhere and stay self-contained).

This module owns the SVG primitives (document, escaping, text measuring and fitting, polyline and
polygon, bars, axis labels, legend, the plot frame); the report's charts (``plots.py``) and the
trace plot (``traces/render.py``) are drawn with them.

Every chart lays itself out from its own text: text widths are estimated conservatively
(``text_width``, wider than DejaVu Sans, Liberation Sans or Arial render them), the left margin
makes room for the longest y tick label, titles and axis labels wrap or are shortened with an
ellipsis (the full text stays in a ``<title>`` tooltip), x tick labels are thinned until they do
not touch, and the legend flows in rows below the plot, growing the chart's height, so that it
never covers the plot, another entry or the edge of the viewBox (``tests/test_report_browser.py``
checks this in a headless browser).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from html import escape

__all__ = [
    "COLORS",
    "Frame",
    "bar",
    "empty",
    "escape",
    "fit",
    "flow_legend",
    "fmt_value",
    "log_ticks",
    "open_svg",
    "polygon",
    "polyline",
    "svg_text",
    "text_width",
    "ticks",
    "value_ticks",
    "wrap",
    "x_label",
    "y_axis",
]

W = 640  # every report chart is this wide; its height follows from its content
MARGIN = 8  # blank border inside the viewBox
FONT, TITLE_FONT = 11, 13
LINE, TITLE_LINE = 15, 18  # baseline-to-baseline distances: > 1.17 em, the font's ascent + descent
PLOT_H = 220
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


# -- text ------------------------------------------------------------------------------------------

# Advance widths in em, rounded up from the widest common sans-serif (DejaVu Sans): a text never
# renders wider than its estimate, so a layout computed from estimates does not clip or overlap.
_NARROW = frozenset("ijl.,:;'!|`I ")
_SEMI = frozenset('frt()[]{}-/\\"*')
_WIDE = frozenset("mwMW@%")


def text_width(text: str, font_size: float = FONT, bold: bool = False) -> float:
    """A conservative estimate of ``text``'s rendered width in px at ``font_size``."""
    em = 0.0
    for ch in text:
        if ch in _NARROW:
            em += 0.36
        elif ch in _SEMI:
            em += 0.48
        elif ch in _WIDE:
            em += 1.0
        elif ch.isupper():
            em += 0.8
        else:
            em += 0.66
    return em * font_size * (1.1 if bold else 1.0)


def fit(text: str, max_px: float, font_size: float = FONT, bold: bool = False) -> str:
    """``text``, or its longest prefix that fits in ``max_px`` followed by an ellipsis."""
    if text_width(text, font_size, bold) <= max_px:
        return text
    while text and text_width(text + "…", font_size, bold) > max_px:
        text = text[:-1]
    return text.rstrip() + "…"


def wrap(text: str, max_px: float, font_size: float = FONT, bold: bool = False) -> list[str]:
    """``text`` broken at spaces into lines of at most ``max_px``; a word too long for a line is
    shortened with an ellipsis."""
    lines: list[str] = []
    for word in text.split():
        if lines and text_width(f"{lines[-1]} {word}", font_size, bold) <= max_px:
            lines[-1] += f" {word}"
        else:
            lines.append(fit(word, max_px, font_size, bold))
    return lines or [""]


def svg_text(
    x: float,
    y: float,
    lines: str | Sequence[str],
    *,
    size: float | None = None,
    anchor: str | None = None,
    bold: bool = False,
    cls: str | None = None,
    full: str | None = None,
    line_h: float = LINE,
) -> str:
    """A ``<text>`` at baseline ``y``; several lines become ``<tspan>``s ``line_h`` apart, and
    ``full`` (the unshortened text, when it was shortened) becomes a tooltip."""
    rows = [lines] if isinstance(lines, str) else list(lines)
    attrs = f' x="{x:.1f}" y="{y:.1f}"'
    attrs += f' font-size="{size}"' if size is not None else ""
    attrs += f' text-anchor="{anchor}"' if anchor else ""
    attrs += ' font-weight="bold"' if bold else ""
    attrs += f' class="{cls}"' if cls else ""
    tip = f"<title>{escape(full)}</title>" if full and full != " ".join(rows) else ""
    if len(rows) == 1:
        return f"<text{attrs}>{tip}{escape(rows[0])}</text>"
    spans = "".join(
        f'<tspan x="{x:.1f}" dy="{0 if i == 0 else line_h}">{escape(r)}</tspan>' for i, r in enumerate(rows)
    )
    return f"<text{attrs}>{tip}{spans}</text>"


# -- primitives ------------------------------------------------------------------------------------


def open_svg(width: float, height: float, font_size: int | None = None) -> str:
    """The opening ``<svg>`` tag of a standalone document ``width`` x ``height`` (sans-serif)."""
    size = f' font-size="{font_size}"' if font_size is not None else ""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}" font-family="sans-serif"{size}>'
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
    name = label or fmt_value
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


def flow_legend(
    names: Sequence[str], x: float, y: float, width: float, *, swatch: str = "line"
) -> tuple[list[str], float]:
    """Legend entries (a colour swatch, then the name) flowing left to right in rows from ``(x, y)``
    (top left), wrapping at ``width``; a name too long for a row is shortened (full name as tooltip).
    Returns the elements and the height used."""
    if not names:
        return [], 0.0
    out = ['<g class="legend">']
    cx, row = x, 0
    for i, name in enumerate(names):
        label = fit(name, width - 14)
        w = 14 + text_width(label)
        if cx > x and cx + w > x + width:
            cx, row = x, row + 1
        top = y + row * LINE
        color = COLORS[i % len(COLORS)]
        mark = (
            f'<rect x="{cx:.1f}" y="{top + 7.5:.1f}" width="10" height="3" fill="{color}"/>'
            if swatch == "line"
            else f'<rect x="{cx:.1f}" y="{top + 3:.1f}" width="10" height="10" fill="{color}"/>'
        )
        tip = f"<title>{escape(name)}</title>" if label != name else ""
        out.append(
            f'<g class="legend-entry">{mark}<text x="{cx + 14:.1f}" y="{top + 12:.1f}">{tip}{escape(label)}'
            "</text></g>"
        )
        cx += w + 16
    out.append("</g>")
    return out, (row + 1) * LINE


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def log_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Tick positions (log10 of the values) between ``lo`` and ``hi`` (log10 too): 1-2-5 steps per
    decade, or decades alone, or, in a range narrower than that, evenly spaced positions."""
    for mults in ((1, 2, 5), (1,)):
        out = [
            math.log10(m * 10.0**k)
            for k in range(math.floor(lo) - 1, math.ceil(hi) + 1)
            for m in mults
            if lo - 1e-9 <= math.log10(m * 10.0**k) <= hi + 1e-9
        ]
        if 2 <= len(out) <= n + 1:
            return out
        if len(out) > n + 1:
            continue
        break
    return ticks(lo, hi, n)


def value_ticks(lo: float, hi: float) -> tuple[list[float], float]:
    """``ticks(lo, hi)`` extended by one step past ``hi`` when the data end between two ticks, and
    the axis' new top: the highest line then does not run along the plot's upper edge."""
    t = ticks(lo, hi)
    if len(t) >= 2 and t[-1] < hi - 1e-12 * abs(hi):
        t.append(t[-1] + (t[-1] - t[-2]))
    return t, max(hi, t[-1])


def fmt_value(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"


# -- the report's charts ---------------------------------------------------------------------------


class Frame:
    """A chart's layout: a wrapped title on top, a plot of ``PLOT_H`` with y tick labels left of it
    (and the rotated y label left of those), x tick labels and the x label under it, then the legend
    and any notes.
    ``left``, ``right``, ``top`` and ``bottom`` are the plot's edges."""

    def __init__(
        self, title: str, xlabel: str, ylabel: str, *, y_labels: Sequence[str] = (), x_reserve: float = 0.0
    ) -> None:
        self.title = title
        self.title_lines = wrap(title, W - 2 * MARGIN, TITLE_FONT, bold=True)
        self.top = MARGIN + len(self.title_lines) * TITLE_LINE + 10
        self.ylabel = ylabel
        label_band = FONT * 1.3 + 4 if ylabel else 0.0
        tick_w = max((text_width(s) for s in y_labels), default=0.0)
        self.left = MARGIN + label_band + (tick_w + 6 if y_labels else 0.0)
        self.left = max(self.left, MARGIN + x_reserve)  # the first x tick label is centred on left
        self.right = W - MARGIN - max(x_reserve, 4.0)
        self.bottom = self.top + PLOT_H
        self.xlabel = xlabel
        self.xlabel_lines = wrap(xlabel, self.right - self.left) if xlabel else []

    @property
    def width(self) -> float:
        return self.right - self.left

    def x_at(self, t: float, lo: float, hi: float) -> float:
        """The x of ``t`` on an axis from ``lo`` (the plot's left edge) to ``hi`` (its right edge)."""
        return self.left + (t - lo) / (hi - lo) * self.width

    def y_at(self, t: float, lo: float, hi: float) -> float:
        """The y of ``t`` on an axis from ``lo`` (the plot's bottom) to ``hi`` (its top)."""
        return self.bottom - (t - lo) / (hi - lo) * PLOT_H

    def box(self, stroke: str = "#999") -> str:
        """The plot's outline."""
        return (
            f'<rect class="plot" x="{self.left:.1f}" y="{self.top:.1f}" width="{self.width:.1f}" '
            f'height="{PLOT_H}" fill="none" stroke="{stroke}"/>'
        )

    def head(self) -> list[str]:
        mid = (self.top + self.bottom) / 2
        out = [
            open_svg(W, 0, font_size=FONT),  # the height is set by finish()
            svg_text(
                MARGIN,
                MARGIN + TITLE_FONT,
                self.title_lines,
                size=TITLE_FONT,
                bold=True,
                cls="title",
                full=self.title,
                line_h=TITLE_LINE,
            ),
        ]
        if self.ylabel:
            x = MARGIN + FONT
            label = fit(self.ylabel, PLOT_H)
            tip = f"<title>{escape(self.ylabel)}</title>" if label != self.ylabel else ""
            out.append(
                f'<text x="{x}" y="{mid:.1f}" transform="rotate(-90 {x} {mid:.1f})" text-anchor="middle" '
                f'class="ylabel">{tip}{escape(label)}</text>'
            )
        return out

    def tick_row(self) -> float:
        """Baseline of the x tick labels: clear of the lowest y tick label."""
        return self.bottom + 19

    def foot(
        self, y: float, legend_names: Sequence[str], swatch: str = "line", notes: Sequence[str] = ()
    ) -> tuple[list[str], float]:
        """The x label, the legend and a line for each note from baseline-row ``y`` down; returns
        them and the height."""
        out = []
        if self.xlabel_lines:
            y += LINE
            out.append(
                svg_text((self.left + self.right) / 2, y, self.xlabel_lines, anchor="middle", cls="xlabel")
            )
            y += LINE * (len(self.xlabel_lines) - 1)
        items, h = flow_legend(legend_names, MARGIN, y + 8, W - 2 * MARGIN, swatch=swatch)
        out += items
        y += 8 + h
        for note in notes:
            out.append(svg_text(MARGIN, y + 12, fit(note, W - 2 * MARGIN), full=note, cls="note"))
            y += LINE
        return out, y + MARGIN

    @staticmethod
    def finish(parts: list[str], height: float) -> str:
        h = math.ceil(height)
        parts[0] = open_svg(W, h, font_size=FONT)
        return "\n".join([*parts, "</svg>"])


def empty(title: str) -> str:
    lines = wrap(title, W - 2 * MARGIN, TITLE_FONT, bold=True)
    y = MARGIN + TITLE_FONT + (len(lines) - 1) * TITLE_LINE
    return "\n".join(
        [
            open_svg(W, math.ceil(y + LINE + 4 + MARGIN), font_size=FONT),
            svg_text(
                MARGIN, MARGIN + TITLE_FONT, lines, size=TITLE_FONT, bold=True, full=title, line_h=TITLE_LINE
            ),
            svg_text(MARGIN, y + LINE + 4, "no data in this run"),
            "</svg>",
        ]
    )
