"""Self-contained HTML report: the Markdown facts plus inline SVG plots, no external assets."""

from __future__ import annotations

import re
from html import escape
from typing import Any, cast

from netgain.analysis.render_text import dominant_words, headline, render_markdown
from netgain.analysis.tail import TAIL_PHASES
from netgain.charts import plots, svg
from netgain.contract.report import Report, RunReport


def _sides(r: Report) -> dict[str, RunReport]:
    return {"baseline": r["baseline"], "treatment": r["treatment"]} if r.get("comparison") else {"run": r}


def cdf_plot(r: Report) -> str:
    series = {
        f"{name} ({s['device']})": [[v, q] for q, v in s["series"]["latency_cdf"]]
        for name, s in _sides(r).items()
    }
    return plots.line_chart(
        series, "Latency CDF (done - scheduled)", "latency ms (log)", "fraction <= x", logx=True
    )


def phase_plot(s: RunReport, name: str) -> str:
    t = (s["tail"] or {}).get("p99") or {}
    ph = t.get("phases") or {}
    cats = [p for p in TAIL_PHASES if p in ph]
    return plots.bar_chart(
        cats,
        {
            "median request": [ph[p]["median_mean_ms"] for p in cats],
            ">= p99 request": [ph[p]["tail_mean_ms"] for p in cats],
        },
        f"{name}: phase means, median vs tail (dominant {dominant_words(t)})",
        "ms",
    )


UTIL_WORDS = {
    "gpu_utilization_ratio": "GPU utilization",
    "gpu_sm_active_ratio": "GPU SMs active",
    "kernel_busy_ratio": "device busy (kernel spans)",
    "process_cpu_ratio": "server process CPU (cores)",
}


def util_label(key: str) -> str:
    """A utilization series' legend in words (report.json keeps the metric's name as the key)."""
    if key.startswith("thread_cpu_ratio[") and key.endswith("]"):
        return f"{key[len('thread_cpu_ratio[') : -1]} threads CPU (cores)"
    return UTIL_WORDS.get(key, key)


def util_plot(s: RunReport, name: str) -> str:
    util = (s["series"] or {}).get("utilization") or {}
    ratios = {util_label(k): v for k, v in util.items() if not k.startswith("queue_depth")}
    return plots.line_chart(
        ratios, f"{name}: GPU / CPU utilization", "seconds since run epoch", "ratio (CPU: cores)"
    )


def queue_plot(s: RunReport, name: str) -> str:
    util = (s["series"] or {}).get("utilization") or {}
    q = {k: v for k, v in util.items() if k.startswith("queue_depth")}
    return plots.line_chart(q, f"{name}: queue depth", "seconds since run epoch", "requests")


def cost_plot(r: Report) -> str:
    sides = _sides(r)
    cats = list(sides)
    return plots.bar_chart(
        cats,
        {
            "steady at SLO": [s["cost_per_1k"] for s in sides.values()],
            "autoscaled (cold start + idle)": [
                ((s["cost"] or {}).get("autoscale") or {}).get("cost_per_1k") for s in sides.values()
            ],
        },
        "Cost per 1,000 successful inferences",
        "$",
    )


def autoscale_plot(s: RunReport, name: str) -> str:
    auto = (s["cost"] or {}).get("autoscale") or {}
    if not auto:
        return svg.empty(f"{name}: autoscaling replay")
    cap = auto["capacity_rps"]
    return plots.line_chart(
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


def cold_plot(r: Report) -> str:
    rows = {}
    for name, s in _sides(r).items():
        rows[f"{name} ({s['device']})"] = [
            (
                str(p.get("name")),
                float(p.get("at_s", 0)) - float(p.get("duration_s", 0)),
                float(p.get("duration_s", 0)),
            )
            for p in s["cold_start"] or []
            if isinstance(p, dict)
        ]
    return plots.timeline(rows, "Cold start timeline")


def sweep_plots(s: RunReport, name: str) -> list[str]:
    sweep = s.get("sweep")
    if not sweep:
        return []
    # a point's p99 is null where no request succeeded: the chart takes it as it is
    pts = sorted(cast(list[dict[str, Any]], sweep["points"]), key=lambda p: p["offered_rps"] or 0)
    out = [
        plots.line_chart(
            {"p99": [[p["offered_rps"], p["p99_ms"]] for p in pts]},
            f"{name}: p99 vs offered rate",
            "offered rps",
            "p99 ms",
            markers=True,
        )
    ]
    bpts = sorted([p for p in pts if p.get("batch_size_mean")], key=lambda p: p["batch_size_mean"])
    out.append(
        plots.line_chart(
            {"throughput": [[p["batch_size_mean"], p["throughput_rps"]] for p in bpts]},
            f"{name}: throughput vs mean server batch size",
            "batch size",
            "ok rps",
            markers=True,
        )
    )
    return out


# -- the Markdown report as HTML -----------------------------------------------------------------
# The page shows what report.md says, as HTML: render_text writes a small Markdown subset (headings,
# fenced blocks, pipe tables with "|" escaped in cells, "- " lists, one-line paragraphs, **bold**
# and `code`), and this converts exactly that subset, so the two reports cannot drift apart.

STYLE = (
    "body{font-family:system-ui,sans-serif;color:#222;max-width:1400px;margin:1em auto;padding:0 12px;"
    "line-height:1.4}h1{margin:.2em 0}h2{margin-top:1.6em;border-bottom:1px solid #ddd}h3{margin-top:1.2em}"
    ".verdict{border-left:6px solid #888;background:#f6f6f6;padding:8px 14px;margin:1em 0}"
    ".verdict.net_gain{border-color:#2ca02c}.verdict.no_net_gain{border-color:#d62728}"
    ".verdict.inconclusive{border-color:#ff7f0e}.verdict p{margin:.3em 0}.verdict .outcome{font-size:1.2em}"
    "table{border-collapse:collapse;margin:.6em 0;font-size:.92em}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
    "th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "tbody tr:nth-child(even){background:#fafafa}code{background:#f3f3f3;padding:0 3px}"
    "pre{background:#f6f6f6;padding:8px;white-space:pre-wrap}"
    ".figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,600px),1fr));gap:16px}"
    "figure{margin:0}figure svg{display:block;max-width:100%;height:auto}"
    "figcaption{font-size:.9em;color:#444}"
)
_NUMBER = re.compile(r"-?\d[\d,]*(\.\d+)?(e[+-]?\d+)?$|n/a$")


def _inline(text: str) -> str:
    """Escaped ``text`` with Markdown's **bold** and `code` as HTML."""
    out = escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)


def _cells(line: str) -> list[str]:
    """The cells of a pipe-table row, ``\\|`` being a "|" inside a cell."""
    body = line.strip()[1:-1] if line.strip().endswith("|") else line.strip()[1:]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def _table_html(lines: list[str]) -> str:
    head, rows = _cells(lines[0]), [_cells(x) for x in lines[2:]]
    th = "".join(f"<th>{_inline(c)}</th>" for c in head)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='num'>{_inline(c)}</td>" if _NUMBER.match(c) else f"<td>{_inline(c)}</td>"
            for c in row
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def verdict_html(r: Report) -> str:
    """The headline (verdict, its reasons, the run's validity) as a box coloured by the outcome."""
    outcome = ""
    if r.get("comparison"):
        v = r["verdict"]
        outcome = v.get("outcome") or ("net_gain" if v.get("net_gain") else "no_net_gain")
    out: list[str] = []
    for line in headline(r):
        if line.startswith("  - "):  # a reason: one item of the list under the verdict
            if not out or not out[-1].startswith("<ul>"):
                out.append("<ul></ul>")
            out[-1] = out[-1][: -len("</ul>")] + f"<li>{escape(line[4:])}</li></ul>"
            continue
        m = re.match(r"([A-Z]+: [A-Z][A-Z ]*[A-Z])(.*)", line)
        words, rest = (m.group(1), m.group(2)) if m else ("", line)
        cls = " class='outcome'" if line.startswith("VERDICT:") else ""
        out.append(f"<p{cls}><strong>{escape(words)}</strong>{escape(rest)}</p>")
    return f"<div class='verdict {outcome}'>" + "".join(out) + "</div>"


def _blocks(md: str, r: Report | None) -> list[str]:
    out: list[str] = []
    lines = md.splitlines()
    head = headline(r) if r is not None else None
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            block = lines[i + 1 : j]
            out.append(
                verdict_html(r)
                if r is not None and block == head
                else f"<pre>{escape(chr(10).join(block))}</pre>"
            )
            i = j + 1
        elif m := re.match(r"(#{1,6}) (.*)", line):
            n = len(m.group(1))
            out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
            i += 1
        elif line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(_table_html(lines[i:j]))
            i = j
        elif line.startswith("- "):
            j = i
            while j < len(lines) and lines[j].startswith("- "):
                j += 1
            out.append("<ul>" + "".join(f"<li>{_inline(x[2:])}</li>" for x in lines[i:j]) + "</ul>")
            i = j
        else:
            out.append(f"<p>{_inline(line)}</p>")
            i += 1
    return out


def markdown_html(md: str, r: Report | None = None) -> str:
    """HTML for render_text's Markdown; with the report ``r``, its fenced headline becomes the
    verdict box (``verdict_html``)."""
    return "\n".join(_blocks(md, r))


def render_html(r: Report) -> str:
    figs = [cdf_plot(r), cost_plot(r), cold_plot(r)]
    for name, s in _sides(r).items():
        figs += [phase_plot(s, name), util_plot(s, name), queue_plot(s, name), autoscale_plot(s, name)]
        figs += sweep_plots(s, name)
    # -- netgain compare's crossover (netgain/analysis/crossover.py): one figure after the cost bars --
    cross = r.get("crossover")
    if cross:
        from netgain.analysis.crossover import figure

        figs.insert(2, figure(cross))
    # -- end of the crossover --
    blocks = _blocks(render_markdown(r), r)
    # the charts come right after the verdict box
    at = next(
        (k + 1 for k, b in enumerate(blocks) if b.startswith("<div class='verdict")), min(1, len(blocks))
    )
    figures = "<h2>Charts</h2><div class='figs'>" + "".join(f"<figure>{f}</figure>" for f in figs) + "</div>"
    title = "netgain report" + (
        f": {r['treatment']['device']} vs {r['baseline']['device']}" if r.get("comparison") else ""
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
        + "\n".join([*blocks[:at], figures, *blocks[at:]])
        + "\n</body></html>\n"
    )
