"""Show a trace: a text summary with ASCII charts, and a self-contained SVG plot (no matplotlib),
drawn with the report's SVG primitives (``analysis/svg.py``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netgain.charts.svg import bar, escape, fit, open_svg, polygon, svg_text, x_label, y_axis
from netgain.loadgen.traces.model import Trace

Bin = tuple[float, float, int]  # (low, high, count); low == high == 0 counts zeros


GAP_RESOLUTION_MS = 1e-6  # a nanosecond: gaps below it are float rounding of one instant


def log_histogram(values: np.ndarray, bins: int = 10, zero_below: float = 0.0) -> list[Bin]:
    """Counts in log-spaced bins between the smallest positive value and the largest; zeros first
    (values at or below ``zero_below`` count as zeros)."""
    out: list[Bin] = []
    zeros = int((values <= zero_below).sum())
    if zeros:
        out.append((0.0, 0.0, zeros))
    pos = values[values > zero_below]
    if pos.shape[0]:
        lo, hi = float(pos.min()), float(pos.max())
        if hi <= lo * 1.0001:
            return [*out, (lo, hi, int(pos.shape[0]))]
        edges = np.geomspace(lo, hi, bins + 1)
        counts, _ = np.histogram(pos, bins=edges)
        out += [(float(a), float(b), int(c)) for a, b, c in zip(edges[:-1], edges[1:], counts, strict=True)]
    return out


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1e6 or abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4g}"


def _bars(rows: list[tuple[str, int]], total: int, width: int = 40) -> list[str]:
    if not rows or total <= 0:
        return ["  (none)"]
    label_w = max(len(r[0]) for r in rows)
    top = max(c for _, c in rows) or 1
    return [
        f"  {label:>{label_w}} |{'#' * round(width * c / top):<{width}} {100 * c / total:5.1f}%"
        for label, c in rows
    ]


def _hist_rows(hist: list[Bin], unit: str) -> list[tuple[str, int]]:
    return [(f"0 {unit}" if hi == 0 else f"{_fmt(lo)}-{_fmt(hi)} {unit}", c) for lo, hi, c in hist]


def rate_chart(rates: np.ndarray, bin_s: float, width: int = 60, height: int = 8) -> list[str]:
    """An ASCII column chart of request rate over time, averaged down to at most ``width`` columns."""
    if rates.shape[0] == 0:
        return ["  (no requests)"]
    group = max(1, math.ceil(rates.shape[0] / width))
    pad = (-rates.shape[0]) % group
    cols = np.concatenate([rates, np.full(pad, np.nan)]).reshape(-1, group)
    cols = np.nanmean(cols, axis=1)
    top = float(cols.max()) or 1.0
    levels = np.rint(cols / top * height * 2).astype(int)  # half-row resolution
    lines = []
    for row in range(height, 0, -1):
        chars = ["#" if lv >= 2 * row else "." if lv == 2 * row - 1 else " " for lv in levels]
        label = _fmt(top) if row == height else ""
        lines.append(f"  {label:>8} |{''.join(chars)}")
    lines.append(f"  {'0':>8} +{'-' * cols.shape[0]}")
    end = f"{_fmt(rates.shape[0] * bin_s)} s"
    lines.append(f"  {'':>8}  0 s{end:>{max(cols.shape[0] - 3, len(end))}}")
    lines.append(f"  {'':>8}  one column = {_fmt(group * bin_s)} s")
    return lines


def source_words(source: str) -> str:
    """A trace's source as a user names it: ``file:traffic.csv`` is the file ``traffic.csv``."""
    return source.removeprefix("file:") if source else ""


def summary_text(trace: Trace, info: dict[str, Any]) -> str:
    """The human summary of ``inspect_trace``'s result."""
    b = info["burstiness"]
    ia, sz = info["interarrival_ms"], info["size_bytes"]
    cv = "n/a" if b["cv_interarrival"] is None else f"{b['cv_interarrival']:.3f}"
    iod = "n/a" if b["index_of_dispersion"] is None else f"{b['index_of_dispersion']:.3f}"
    lines = [
        f"trace {source_words(info['source']) or '(no source)'}",
        f"  sha256 {info['digest']}",
        f"  {info['requests']:,} requests over {info['duration_s']:.3f} s: "
        f"mean {info['mean_rate']:.2f} req/s, "
        f"peak {info['peak_rate']:.2f} req/s ({_fmt(info['bin_s'])} s bins)",
        f"  burstiness: cv of inter-arrivals {cv} (0 constant, 1 Poisson, >1 bursty); "
        f"index of dispersion of counts {iod} (1 Poisson)",
    ]
    if ia:
        lines.append("  inter-arrival ms: " + "  ".join(f"{k} {_fmt(v)}" for k, v in ia.items()))
    if sz:
        lines.append(
            "  size bytes:       "
            + "  ".join(f"{k} {_fmt(v)}" for k, v in sz.items())
            + f"  ({100 * info['size_default_fraction']:.1f}% default size)"
        )
    lines += ["", f"rate over time (req/s, {_fmt(info['bin_s'])} s bins):"]
    lines += rate_chart(np.asarray(info["rate_per_bin"]), info["bin_s"])
    gaps = np.diff(trace.t_s) * 1e3
    hist = log_histogram(gaps, zero_below=GAP_RESOLUTION_MS)
    lines += ["", "inter-arrival times:", *_bars(_hist_rows(hist, "ms"), gaps.shape[0])]
    if (trace.size > 0).any():
        lines += [
            "",
            "payload sizes:",
            *_bars(_hist_rows(log_histogram(trace.size.astype(np.float64)), "B"), len(trace)),
        ]
    items = [(f"{k} item{'s' if k != '1' else ''}", c) for k, c in info["items"].items()]
    if len(items) > 16:
        items = sorted(items, key=lambda r: -r[1])[:16]
    lines += ["", f"items per request (mean {info['items_mean']:.3g}):", *_bars(items, len(trace))]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- SVG


def _panel(x0: float, y0: float, w: float, h: float, title: str, xlabel: str, ymax: float) -> list[str]:
    out = [
        f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="#fafafa" stroke="#999"/>',
        f'<text x="{x0}" y="{y0 - 8}" font-size="13" font-weight="bold">{escape(title)}</text>',
        x_label(x0 + w / 2, y0 + h + 32, xlabel, font_size=11),
    ]
    return out + y_axis(
        (0.0, 0.5, 1.0),
        lambda frac: y0 + h - frac * h,
        x0,
        label=lambda frac: _fmt(ymax * frac),
        font_size=10,
    )


def _hist_svg(
    hist: list[Bin], total: int, x0: float, y0: float, w: float, h: float, title: str, unit: str
) -> list[str]:
    if not hist or total <= 0:
        return _panel(x0, y0, w, h, title + " (none)", unit, 0.0)
    top = max(c for *_, c in hist) / total
    out = _panel(x0, y0, w, h, title, unit, 100 * top)
    bw = w / len(hist)
    for k, (lo, hi, c) in enumerate(hist):
        bh = (c / total) / top * h if top else 0
        x = x0 + k * bw
        out.append(bar(x + 1, y0 + h - bh, bw - 2, bh, "#4c78a8", f"{_fmt(lo)}-{_fmt(hi)} {unit}: {c}"))
        if k % max(1, len(hist) // 5) == 0:
            label = "0" if hi == 0 else _fmt(lo)
            out.append(f'<text x="{x:.1f}" y="{y0 + h + 14}" font-size="10">{escape(label)}</text>')
    return out


def svg_plot(trace: Trace, info: dict[str, Any]) -> str:
    """Rate over time, inter-arrival histogram and size histogram as one standalone SVG document."""
    W, H, m = 900, 640, 70
    rates = np.asarray(info["rate_per_bin"], dtype=np.float64)
    if rates.shape[0] > 2000:  # keep the file small: average down to 2000 points
        group = math.ceil(rates.shape[0] / 2000)
        pad = (-rates.shape[0]) % group
        rates = np.nanmean(np.concatenate([rates, np.full(pad, np.nan)]).reshape(-1, group), axis=1)
    bin_s = info["duration_s"] / max(rates.shape[0], 1) if rates.shape[0] else info["bin_s"]
    pw, ph = W - 2 * m, 200
    top = float(rates.max()) if rates.shape[0] and rates.max() > 0 else 1.0
    head = (
        f"{source_words(info['source']) or 'trace'}: {info['requests']:,} requests, "
        f"{info['duration_s']:.1f} s, "
        f"mean {info['mean_rate']:.1f} req/s"
    )
    out = [
        open_svg(W, H),
        f'<rect width="{W}" height="{H}" fill="white"/>',
        svg_text(m, 22, fit(head, W - m - 10, 14), size=14, full=head),
    ]
    out += _panel(m, 50, pw, ph, f"rate over time (req/s, {_fmt(info['bin_s'])} s bins)", "seconds", top)
    if rates.shape[0]:
        xs = m + np.arange(rates.shape[0] + 1) / max(rates.shape[0], 1) * pw
        pts = [(float(xs[0]), 50.0 + ph)]
        for k, r in enumerate(rates):
            y = 50 + ph - r / top * ph
            pts += [(float(xs[k]), y), (float(xs[k + 1]), y)]
        pts.append((float(xs[-1]), 50.0 + ph))
        out.append(polygon(pts, fill="#9ecae9", stroke="#1f77b4", width=1))
        for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
            out.append(
                x_label(m + frac * pw, 50 + ph + 14, _fmt(frac * rates.shape[0] * bin_s), font_size=10)
            )
    hw = (W - 3 * m) / 2
    gaps = np.diff(trace.t_s) * 1e3
    out += _hist_svg(
        log_histogram(gaps, 16, zero_below=GAP_RESOLUTION_MS),
        gaps.shape[0],
        m,
        350,
        hw,
        220,
        "inter-arrival times (% of gaps, log bins)",
        "ms",
    )
    out += _hist_svg(
        log_histogram(trace.size.astype(np.float64), 16),
        len(trace),
        2 * m + hw,
        350,
        hw,
        220,
        "payload sizes (% of requests, log bins)",
        "bytes",
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"
