"""Self-contained HTML report: the Markdown facts plus inline SVG plots, no external assets."""

from __future__ import annotations

from html import escape
from typing import Any

from netgain.loadgen.analysis import svg
from netgain.loadgen.analysis.render_text import headline, render_markdown
from netgain.loadgen.analysis.tail import TAIL_PHASES


def _sides(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"baseline": r["baseline"], "treatment": r["treatment"]} if r.get("comparison") else {"run": r}


def cdf_plot(r: dict[str, Any]) -> str:
    series = {
        f"{name} ({s.get('device')})": [[v, q] for q, v in s["series"]["latency_cdf"]]
        for name, s in _sides(r).items()
    }
    return svg.line_chart(
        series, "Latency CDF (done - scheduled)", "latency ms (log)", "fraction <= x", logx=True
    )


def phase_plot(s: dict[str, Any], name: str) -> str:
    t = (s.get("tail") or {}).get("p99") or {}
    ph = t.get("phases") or {}
    cats = [p for p in TAIL_PHASES if p in ph]
    return svg.bar_chart(
        cats,
        {
            "median request": [ph[p]["median_mean_ms"] for p in cats],
            ">= p99 request": [ph[p]["tail_mean_ms"] for p in cats],
        },
        f"{name}: phase means, median vs tail (dominant {t.get('dominant')})",
        "ms",
    )


def util_plot(s: dict[str, Any], name: str) -> str:
    util = (s.get("series") or {}).get("utilization") or {}
    ratios = {k: v for k, v in util.items() if not k.startswith("queue_depth")}
    return svg.line_chart(
        ratios, f"{name}: GPU / CPU utilization", "seconds since run epoch", "ratio (CPU: cores)"
    )


def queue_plot(s: dict[str, Any], name: str) -> str:
    util = (s.get("series") or {}).get("utilization") or {}
    q = {k: v for k, v in util.items() if k.startswith("queue_depth")}
    return svg.line_chart(q, f"{name}: queue depth", "seconds since run epoch", "requests")


def cost_plot(r: dict[str, Any]) -> str:
    sides = _sides(r)
    cats = list(sides)
    return svg.bar_chart(
        cats,
        {
            "steady at SLO": [s.get("cost_per_1k") for s in sides.values()],
            "autoscaled (cold start + idle)": [
                ((s.get("cost") or {}).get("autoscale") or {}).get("cost_per_1k") for s in sides.values()
            ],
        },
        "Cost per 1,000 successful inferences",
        "$",
    )


def autoscale_plot(s: dict[str, Any], name: str) -> str:
    auto = (s.get("cost") or {}).get("autoscale") or {}
    if not auto:
        return svg.empty(f"{name}: autoscaling replay")
    cap = auto["capacity_rps"]
    return svg.line_chart(
        {
            "arrivals / capacity": [[i, v / cap] for i, v in enumerate(auto["rate_rps"])],
            "billed replicas": [[i, v] for i, v in enumerate(auto["replicas"])],
            "ready replicas": [[i, v] for i, v in enumerate(auto["ready"])],
        },
        f"{name}: autoscaling replay of the recorded traffic",
        "seconds",
        "replicas",
        step=True,
    )


def cold_plot(r: dict[str, Any]) -> str:
    rows = {}
    for name, s in _sides(r).items():
        rows[f"{name} ({s.get('device')})"] = [
            (
                str(p.get("name")),
                float(p.get("at_s", 0)) - float(p.get("duration_s", 0)),
                float(p.get("duration_s", 0)),
            )
            for p in s.get("cold_start") or []
            if isinstance(p, dict)
        ]
    return svg.timeline(rows, "Cold start timeline")


def sweep_plots(s: dict[str, Any], name: str) -> list[str]:
    sweep = s.get("sweep")
    if not sweep:
        return []
    pts = sorted(sweep["points"], key=lambda p: p["offered_rps"] or 0)
    out = [
        svg.line_chart(
            {"p99": [[p["offered_rps"], p["p99_ms"]] for p in pts]},
            f"{name}: p99 vs offered rate",
            "offered rps",
            "p99 ms",
            markers=True,
        )
    ]
    bpts = sorted([p for p in pts if p.get("batch_size_mean")], key=lambda p: p["batch_size_mean"])
    out.append(
        svg.line_chart(
            {"throughput": [[p["batch_size_mean"], p["throughput_rps"]] for p in bpts]},
            f"{name}: throughput vs mean server batch size",
            "batch size",
            "ok rps",
            markers=True,
        )
    )
    return out


def render_html(r: dict[str, Any]) -> str:
    figs = [cdf_plot(r), cost_plot(r), cold_plot(r)]
    for name, s in _sides(r).items():
        figs += [phase_plot(s, name), util_plot(s, name), queue_plot(s, name), autoscale_plot(s, name)]
        figs += sweep_plots(s, name)
    verdict = escape("\n".join(headline(r)))
    md = escape(render_markdown(r))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>netgain report</title><style>"
        "body{font-family:sans-serif;max-width:1400px;margin:1em auto}pre{background:#f6f6f6;padding:8px;"
        "white-space:pre-wrap}.figs{display:flex;flex-wrap:wrap;gap:8px}.v{font-size:1.1em}</style></head>"
        f"<body><h1>netgain report</h1><pre class='v'>{verdict}</pre><div class='figs'>"
        + "".join(f"<figure>{f}</figure>" for f in figs)
        + f"</div><h2>Details</h2><pre>{md}</pre></body></html>\n"
    )
