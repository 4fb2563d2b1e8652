"""Terminal summary (verdict first) and the Markdown report, both from the report dict alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from netgain.analysis.tail import CLIENT_PHASES
from netgain.contract.report import Bottleneck, Report, RunReport

OUTCOME_WORDS = {"net_gain": "NET GAIN", "no_net_gain": "NO NET GAIN", "inconclusive": "INCONCLUSIVE"}


def num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if abs(x) < 1e-9:  # float rounding of a zero (a difference of equal sums): never "-2.2e-17"
            return f"{0.0:.{digits}f}"
        return f"{x:.{digits}f}" if abs(x) >= 10**-digits else f"{x:.3g}"
    return str(x)


def ci(c: Any, digits: int = 3) -> str:
    return f"[{num(c[0], digits)}, {num(c[1], digits)}]" if c else "n/a"


def headline(r: Report) -> list[str]:
    """Verdict (or validity) first: the one line a user reads."""
    lines = []
    if r.get("comparison"):
        v = r["verdict"]
        outcome = v.get("outcome") or ("net_gain" if v["net_gain"] else "no_net_gain")
        lines.append(
            f"VERDICT: {OUTCOME_WORDS.get(outcome, outcome)} "
            f"(treatment {r['treatment']['device']} vs baseline {r['baseline']['device']})"
        )
        lines += [f"  - {x}" for x in v["reasons"]]
    failed = r.get("failed_headline") or ""
    partial = "PARTIAL RUN (interrupted), " if r["interrupted"] else ""
    lines.append(
        f"RUN: {partial}{'VALID' if r['valid'] else 'INVALID'}"
        + ("" if r["valid"] else " - " + "; ".join(r["invalid_reasons"] or []))
        + (f" - {failed}" if failed else "")
    )
    return lines


def bottleneck_words(b: Bottleneck | dict[str, Any]) -> str:
    """Every kind that applies with its next action: ``upstream-bound (interpreter): more processes ...``."""
    kinds = b.get("kinds") or [b]
    words = "; and ".join(
        f"{k['kind']}"
        + (f" ({k['resource']})" if k.get("resource") not in (None, "none", k["kind"]) else "")
        + (f": next, {k['action']}" if k.get("action") else "")
        for k in kinds
    )
    return words + (" [per-process rule approximate]" if b.get("approximate") else "")


def dominant_words(t: dict[str, Any]) -> str:
    """A tail section's dominant phase, said to be client-side when it is the send lag, or why no
    phase is named when the rows carried no server-timing trailer."""
    dom = t.get("dominant")
    if dom in CLIENT_PHASES:
        return f"{dom} (client-side: the load generator's delay before sending, not server time)"
    if dom:
        return str(dom)
    if t.get("n") and t.get("phases"):
        return "unknown (no server-timing trailer: only the client-side send lag is measured)"
    return "n/a"


def server_line(c: dict[str, Any] | None) -> str:
    if c is None:  # an OIP or HTTP run: no ServerInfo says how the server is laid out
        return "  server: configuration unknown (no netgain ServerInfo from this target)"
    procs = f"{c['workers']} frontend processes + 1 device process" if c.get("workers") else "one process"
    return (
        f"  server: {procs}, max batch {num(c.get('max_batch_size'))}, queue delay "
        f"{num(c.get('max_queue_delay_ms'))} ms, pre threads {num(c.get('pre_threads'))}, intra-op threads "
        f"{num(c.get('intra_op_threads'))}, dtype {c.get('dtype') or 'n/a'}"
    )


def run_lines(r: RunReport, label: str = "") -> list[str]:
    lat, lag = r["latency_ms"], r["send_lag_ms"]
    cost = r["cost"] or {}
    auto = cost.get("autoscale") or {}
    tail = r["tail"] or {}
    p99t = tail.get("p99") or {}
    dom = p99t.get("dominant")
    dom_x = ((p99t.get("phases") or {}).get(dom) or {}).get("excess_ms") if dom else None
    pre = f"{label}: " if label else ""
    return [
        f"{pre}device {r['device']}, model {r['model']}, {r['counts']['measured']} measured requests "
        f"over {num(r['window_s']['duration'], 1)} s",
        server_line(r["server_config"]),
        f"  latency ms  p50 {num(lat['p50'])}  p90 {num(lat['p90'])}  p95 {num(lat['p95'])}  "
        f"p99 {num(lat['p99'])} "
        f"{ci((r['latency_ci_ms'] or {}).get('p99'))}  p99.9 {num(lat['p999'])}  max {num(lat['max'])}",
        f"  throughput {num(r['throughput_rps'], 2)} ok/s completed {ci(r['throughput_ci_rps'], 2)} "
        f"(offered {num(r['offered_rps'], 2)}/s), "
        f"error rate {num(r['error_rate'], 4)}, errors {r['errors'] or 'none'}",
        f"  send lag ms p99 {num(lag['p99'])} max {num(lag['max'])}",
        f"  tail (>= p99): dominant phase {dominant_words(p99t)}"
        + (f" (+{num(dom_x)} ms over the median request)" if dom else ""),
        f"  bottleneck: {bottleneck_words(r['bottleneck'])}",
        f"  cost per 1k: {num(r['cost_per_1k'], 6)} (price/h {num(cost.get('price_per_hour'))}, "
        f"SLO p99 {num(cost.get('slo_p99_ms'))} ms held: {num(cost.get('slo_held'))})"
        + (
            f"; autoscaled {num(auto.get('cost_per_1k'), 6)}, "
            f"idle {num(auto.get('idle_instance_seconds'), 0)} "
            f"instance-s, {num(auto.get('slo_violation_s'), 0)} s short of capacity"
            if auto
            else ""
        ),
        f"  cold start {num(r['cold_start_s'])} s",
    ]


def terminal(r: Report) -> str:
    lines = headline(r)
    if r.get("comparison"):
        lines += run_lines(r["baseline"], "baseline")
        lines += run_lines(r["treatment"], "treatment")
        rt = r["ratios"]
        lines.append(
            "ratios treatment/baseline: "
            + ", ".join(f"{k} {num(v['value'])} {ci(v['ci'])}" for k, v in rt.items())
        )
        lines += [f"  maintainability: {m}" for m in r.get("maintainability") or []]
    else:
        lines += run_lines(r)
    for e in r["bottleneck"]["evidence"]:
        lines.append(f"  evidence: {e}")
    lines += [f"warning: {w}" for w in r["warnings"] or []]
    return "\n".join(lines) + "\n"


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cells = [[(num(c) if not isinstance(c, str) else c).replace("|", "\\|") for c in row] for row in rows]
    out += ["| " + " | ".join(row) + " |" for row in cells]
    return [*out, ""]


def run_markdown(r: RunReport, title: str) -> list[str]:
    lat = r["latency_ms"]
    md = [
        f"## {title}",
        "",
        f"Run `{r['run_dir']}` on **{r['device']}**, "
        f"{'PARTIAL RUN (interrupted), ' if r['interrupted'] else ''}"
        f"{'VALID' if r['valid'] else 'INVALID'}, bottleneck **{bottleneck_words(r['bottleneck'])}**.",
        "",
    ]
    md += _table(
        ["", "p50", "p90", "p95", "p99", "p99.9", "max"],
        [
            ["latency ms", lat["p50"], lat["p90"], lat["p95"], lat["p99"], lat["p999"], lat["max"]],
            ["send lag ms", *(r["send_lag_ms"][k] for k in ("p50", "p90", "p95", "p99", "p999", "max"))],
            ["service ms", *(r["service_ms"][k] for k in ("p50", "p90", "p95", "p99", "p999", "max"))],
        ],
    )
    md.append(
        f"p99 95% CI {ci((r['latency_ci_ms'] or {}).get('p99'))} ms; throughput "
        f"{num(r['throughput_rps'], 2)} ok/s, 95% CI {ci(r['throughput_ci_rps'], 2)}; error rate "
        f"{num(r['error_rate'], 4)}; statuses {r['statuses']}."
    )
    for k, e in (r["enough_samples"] or {}).items():
        md.append(
            f"- {k}: {e['n']} samples, {e['samples_above']} above it; 95% upper bound "
            f"{num(e['upper_bound_ms'])} ms ({'enough' if e['enough'] else 'NOT enough'}, "
            f"needs >= {e['min_samples']})"
        )
    md += ["", "### Phases (ms)", ""]
    md += _table(
        ["phase", "mean", "p50", "p90", "p99", "max"],
        [
            [p, s.get("mean"), s.get("p50"), s.get("p90"), s.get("p99"), s.get("max")]
            for p, s in r["phases_ms"].items()
        ],
    )
    for key in ("p99", "p999"):
        t = (r["tail"] or {}).get(key) or {}
        md += [f"### Tail >= {key} ({t.get('n', 0)} requests): dominant **{dominant_words(t)}**", ""]
        md += _table(
            ["phase", "tail mean", "median mean", "excess", "share"],
            [
                [p, v["tail_mean_ms"], v["median_mean_ms"], v["excess_ms"], v["share"]]
                for p, v in (t.get("phases") or {}).items()
            ],
        )
        by = t.get("by_batch_size") or {}
        if by:
            md += _table(
                ["batch size", "tail requests", "dominant"],
                [[s, v["n"], str(v["dominant"])] for s, v in by.items()],
            )
    md += ["### Bottleneck evidence", ""]
    kinds: list[Mapping[str, Any]] = [*r["bottleneck"]["kinds"]] or [r["bottleneck"]]
    for kind in kinds:
        md += [f"**{kind['kind']}**" + (f" — next: {kind['action']}" if kind.get("action") else ""), ""]
        md += [f"- {e}" for e in kind["evidence"]] + [""]
    cost = r["cost"] or {}
    auto = cost.get("autoscale") or {}
    md += [
        "### Cost",
        "",
        f"- cost per 1k at SLO: {num(r['cost_per_1k'], 6)} "
        f"(measured throughput: {num(cost.get('cost_per_1k_measured'), 6)})"
        + (f"; {cost['note']}" if cost.get("note") else ""),
    ]
    if auto:
        md.append(
            f"- autoscaled replay: capacity {num(auto['capacity_rps'], 2)} rps/replica "
            f"({auto.get('capacity_source')}), cold start {num(auto['cold_start_s'])} s, "
            f"min replicas {auto['min_replicas']}, max {auto['max_replicas']}, "
            f"{num(auto['instance_seconds'], 0)} instance-s ({num(auto['idle_instance_seconds'], 0)} idle), "
            f"{num(auto['slo_violation_s'], 0)} s short of capacity, cost per 1k "
            f"{num(auto['cost_per_1k'], 6)}"
        )
    md.append(f"- cold start: {num(r['cold_start_s'])} s")
    return [*md, ""]


def render_markdown(r: Report) -> str:
    md = ["# netgain report", "", "```", *headline(r), "```", ""]
    if r.get("comparison"):
        md += ["## Ratios (treatment / baseline)", ""]
        md += _table(
            ["metric", "ratio", "95% CI"], [[k, v["value"], ci(v["ci"])] for k, v in r["ratios"].items()]
        )
        if r.get("maintainability"):
            md += ["## Maintainability costs", ""] + [f"- {m}" for m in r["maintainability"]] + [""]
        md += run_markdown(r["baseline"], "Baseline") + run_markdown(r["treatment"], "Treatment")
    else:
        md += run_markdown(r, "Run")
    sweep = r.get("sweep")
    if sweep:
        md += [
            "## Rate sweep",
            "",
            f"Capacity at SLO: {num(sweep.get('capacity_rps'), 2)} rps "
            f"({sweep.get('runs_meeting_slo')} of {sweep.get('runs')} runs met it)",
            "",
        ]
        md += _table(
            ["run", "offered rps", "ok rps", "p99 ms", "batch mean", "valid"],
            [
                [
                    p["run_dir"],
                    p["offered_rps"],
                    p["throughput_rps"],
                    p["p99_ms"],
                    p["batch_size_mean"],
                    str(p["valid"]),
                ]
                for p in sweep["points"]
            ],
        )
    if r["warnings"]:
        md += ["## Warnings", ""] + [f"- {w}" for w in r["warnings"]]
    return "\n".join(md) + "\n"
