"""The crossover: each side's cost per 1,000 successful inferences at the SLO against the request
rate, and the lowest rate tried at which the treatment is the cheaper one.

For a steady rate ``r`` a side needs ``ceil(r / capacity)`` replicas, its capacity being the
per-replica capacity at the SLO that its rate sweep measured (``capacity_at_slo``: the best valid
completed throughput among the sweep's runs that held the SLO). It pays for all of them, the idle
part of the last one included: cost per 1k = replicas x price per hour / (r x 3600 / 1000). A side
that held the SLO at none of the rates tried has no capacity, so no cost at the SLO: the crossover is
then inconclusive. The crossover is read at the rates tried, without interpolation: when the
treatment first wins at rate r_k, the true crossover lies in (r_{k-1}, r_k].
"""

from __future__ import annotations

import math
from typing import Any

from netgain.charts import svg

SIDES = ("baseline", "treatment")


def replicas_needed(rate_rps: float, capacity_rps: float) -> int:
    """Replicas of ``capacity_rps`` each that carry ``rate_rps`` (at least one)."""
    return max(1, math.ceil(rate_rps / capacity_rps - 1e-9))


def cost_per_1k_at(rate_rps: float, capacity_rps: float | None, price_per_hour: float | None) -> float | None:
    """Cost per 1,000 successful inferences of traffic at ``rate_rps``, idle capacity included."""
    if capacity_rps is None or capacity_rps <= 0 or price_per_hour is None or rate_rps <= 0:
        return None
    return replicas_needed(rate_rps, capacity_rps) * price_per_hour / (rate_rps * 3600.0 / 1000.0)


def _rate(r: float) -> str:
    return f"{r:g} req/s"


def crossover(
    rates_rps: list[float],
    sides: dict[str, dict[str, Any]],
    *,
    slo_p99_ms: float | None = None,
) -> dict[str, Any]:
    """Cost per 1k at the SLO of both sides at each rate tried, and where the treatment starts to win.

    ``sides``: ``{"baseline": {...}, "treatment": {...}}``, each with ``capacity_rps`` (None when the
    side held the SLO at no rate tried) and ``price_per_hour``, plus anything to keep beside them
    (device, batch size, tuned configuration, the sweep's counts). Returns the report's ``crossover``
    section: ``rates_rps``, per side ``replicas`` and ``cost_per_1k`` per rate, ``treatment_cheaper``
    per rate, ``crossover_rps`` (or None), ``outcome`` (``crossover``, ``not_within_rates`` or
    ``inconclusive``) and ``reason``.
    """
    rates = sorted({float(r) for r in rates_rps if r > 0})
    out: dict[str, Any] = {
        "rates_rps": rates,
        "slo_p99_ms": slo_p99_ms,
        "method": "at each rate tried, ceil(rate / capacity at the SLO) replicas per side, idle capacity "
        "paid: cost per 1k = replicas x price per hour / (rate x 3.6); no interpolation between rates",
    }
    for name in SIDES:
        s = dict(sides[name])
        cap, price = s.get("capacity_rps"), s.get("price_per_hour")
        s["replicas"] = [replicas_needed(r, cap) if cap else None for r in rates]
        s["cost_per_1k"] = [cost_per_1k_at(r, cap, price) for r in rates]
        out[name] = s
    b, t = out["baseline"], out["treatment"]
    cheaper = [
        (tc < bc) if tc is not None and bc is not None else None
        for tc, bc in zip(t["cost_per_1k"], b["cost_per_1k"], strict=True)
    ]
    out["treatment_cheaper"] = cheaper
    out["crossover_rps"] = None
    out["wins_at_every_higher_rate"] = None
    unknown = [
        name
        for name in SIDES
        if out[name].get("capacity_rps") is None or out[name].get("price_per_hour") is None
    ]
    tried = ", ".join(f"{r:g}" for r in rates) + " req/s" if rates else "none"
    if not rates:
        out["outcome"] = "inconclusive"
        out["reason"] = "no rate was swept: nothing to price"
    elif unknown:
        why = []
        for name in unknown:
            s = out[name]
            if s.get("price_per_hour") is None:
                why.append(f"the {name} has no price per hour")
            else:
                met = s.get("runs_meeting_slo")
                runs = s.get("runs")
                counts = f" ({met} of {runs} sweep runs met it)" if runs is not None else ""
                why.append(
                    f"the {name} ({s.get('device') or '?'}) held the SLO"
                    f"{f' p99 <= {slo_p99_ms:g} ms' if slo_p99_ms else ''} at none of the rates tried"
                    f"{counts}, so its capacity and its cost at the SLO are unknown"
                )
        out["outcome"] = "inconclusive"
        out["reason"] = "; ".join(why) + f" (rates tried: {tried})"
    else:
        first = next((i for i, c in enumerate(cheaper) if c), None)
        top = len(rates) - 1
        if first is None:
            ratio = t["cost_per_1k"][top] / b["cost_per_1k"][top]
            out["outcome"] = "not_within_rates"
            out["reason"] = (
                f"not within the rates tried ({tried}): the treatment is cheaper at none; at "
                f"{_rate(rates[top])} it costs x{ratio:.3f} the baseline's per 1k "
                f"({t['replicas'][top]} x {t['price_per_hour']:g}/h vs {b['replicas'][top]} x "
                f"{b['price_per_hour']:g}/h)"
            )
        else:
            r = rates[first]
            ratio = t["cost_per_1k"][first] / b["cost_per_1k"][first]
            out["crossover_rps"] = r
            out["wins_at_every_higher_rate"] = all(c for c in cheaper[first:])
            out["outcome"] = "crossover"
            where = (
                f"already at the lowest rate tried, {_rate(r)}"
                if first == 0
                else f"from {_rate(r)} (somewhere in ({rates[first - 1]:g}, {r:g}] req/s; no interpolation)"
            )
            later = [rates[i] for i in range(first, len(rates)) if not cheaper[i]]
            out["reason"] = (
                f"the treatment is cheaper per 1k at the SLO {where}: x{ratio:.3f} "
                f"({t['replicas'][first]} x {t['price_per_hour']:g}/h vs {b['replicas'][first]} x "
                f"{b['price_per_hour']:g}/h)"
                + (
                    "; but not again at " + ", ".join(f"{x:g}" for x in later) + " req/s (replica steps)"
                    if later
                    else ""
                )
            )
    return out


def line(c: dict[str, Any]) -> str:
    """The verdict's one line about the crossover."""
    t, b = c.get("treatment") or {}, c.get("baseline") or {}
    who = f"treatment {t.get('device') or '?'} vs baseline {b.get('device') or '?'}"
    if c.get("outcome") == "crossover":
        head = f"CROSSOVER at {_rate(c['crossover_rps'])}"
    elif c.get("outcome") == "not_within_rates":  # the reason starts with the words: said once
        return f"CROSSOVER: {c.get('reason')} ({who})"
    else:
        head = "CROSSOVER: INCONCLUSIVE"
    return f"{head} ({who}): {c.get('reason')}"


# -- the HTML report's chart ----------------------------------------------------------------------


def plot(c: dict[str, Any]) -> str:
    """Cost per 1k at the SLO against the request rate, both sides, the crossover marked (laid out
    by ``svg.Frame``, as the report's other charts)."""
    title = "Cost per 1k at the SLO vs request rate (crossover)"
    rates: list[float] = list(c.get("rates_rps") or [])
    series = {
        f"{name} ({c[name].get('device') or '?'})": [
            (r, v) for r, v in zip(rates, c[name].get("cost_per_1k") or [], strict=False) if v is not None
        ]
        for name in SIDES
        if name in c
    }
    pts = [p for s in series.values() for p in s]
    if not rates or not pts:
        return svg.empty(f"{title}: {c.get('reason') or 'no data'}")
    logx = len(rates) > 1 and rates[-1] / rates[0] >= 4

    def fx(x: float) -> float:
        return math.log10(x) if logx else x

    x0, x1 = fx(rates[0]), fx(rates[-1])
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1
    # log y: a fully used replica's cost per 1k falls as 1 / rate, so both sides span decades
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    y0, y1 = math.log10(lo / 1.25), math.log10(hi * 1.25)
    yt = svg.log_ticks(y0, y1)

    def yname(t: float) -> str:
        return f"{10**t:.2g}"

    xnames = [f"{r:g}" for r in rates]
    fr = svg.Frame(
        title,
        "request rate, req/s" + (" (log)" if logx else ""),
        "$ per 1k successful (log)",
        y_labels=[yname(t) for t in yt],
        x_reserve=max(svg.text_width(n) for n in xnames) / 2 + 2,
    )

    def sx(x: float) -> float:
        return fr.x_at(fx(x), x0, x1)

    def sy(y: float) -> float:
        return fr.y_at(math.log10(y), y0, y1)

    out = [*fr.head(), fr.box()]
    out += svg.y_axis(yt, lambda t: fr.y_at(t, y0, y1), fr.left, grid_to=fr.right, label=yname)
    row = fr.tick_row()
    out += [svg.x_label(sx(r), row, n) for r, n in zip(rates, xnames, strict=True)]
    names = []
    for i, (name, s) in enumerate(series.items()):
        color = svg.COLORS[i % len(svg.COLORS)]
        if s:
            out.append(svg.polyline([(sx(x), sy(y)) for x, y in s], color))
        out += [
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
            f"<title>{svg.escape(name)} at {x:g} req/s: {y:.6g} per 1k</title></circle>"
            for x, y in s
        ]
        names.append(name if s else f"{name}: capacity unknown (held the SLO at no rate tried)")
    cross = c.get("crossover_rps")
    if cross is not None:
        x = sx(cross)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{fr.top:.1f}" y2="{fr.bottom:.1f}" stroke="#2ca02c" '
            'stroke-width="1.5" stroke-dasharray="4 3"/>'
        )
        note = f"crossover at {cross:g} req/s (dashed)"
    else:
        words = "not within the rates tried" if c.get("outcome") == "not_within_rates" else "inconclusive"
        note = f"crossover: {words}"
    foot, height = fr.foot(row, names, notes=[note])
    return fr.finish(out + foot, height)


def figure(c: dict[str, Any]) -> str:
    """The chart and, under it, the verdict's crossover line (the inside of an HTML ``<figure>``)."""
    return plot(c) + f"<figcaption style='max-width:640px'>{svg.escape(line(c))}</figcaption>"
