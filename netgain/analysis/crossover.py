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

from netgain.analysis import pricing
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


def _bounds(cap: dict[str, Any]) -> tuple[float, float, float] | None:
    """(low, point, high) capacity of a searched side: the best completed throughput that held, and
    the first rate that missed (infinite when it held up to the ceiling); None when unknown."""
    point = cap.get("capacity_rps")
    if not point or point <= 0:
        return None
    high = cap.get("first_missed")
    high = math.inf if cap.get("unbounded") or high is None else max(float(high), float(point))
    return float(point), float(point), high


def _grid(lo: float, hi: float, n: int = 96) -> list[float]:
    step = (math.log10(hi) - math.log10(lo)) / (n - 1)
    return [float(f"{10 ** (math.log10(lo) + i * step):.6g}") for i in range(n)]


def _cost(rate: float, cap: float, price: float) -> float:
    return pricing.replicas(rate, cap) * price / (rate * 3.6)


def from_capacities(sides: dict[str, dict[str, Any]], *, slo_p99_ms: float | None = None) -> dict[str, Any]:
    """The crossover from each side's searched capacity (``capacity``: ``Capacity.to_dict()``) and
    price: cost per 1k at the SLO as a curve over rate, and the rate from which the treatment is
    cheaper for good, computed on the replica steps, with its interval from both brackets.

    The same keys as ``crossover`` (``rates_rps`` is then a grid spanning both capacities and the
    crossover), plus ``crossover_interval_rps``, ``first_cheaper_rps``, per side ``capacity`` and
    ``cost_per_1k_low``/``cost_per_1k_high`` (at the top and at the bottom of its bracket), and
    ``source: "search"``. Outcomes: ``crossover``, ``never`` (the treatment costs more per unit of
    capacity), ``only_baseline``/``only_treatment``/``neither`` (a side meets the SLO at no rate
    down to its floor), ``inconclusive`` (a capacity or a price unknown).
    """
    slo = f"p99 <= {slo_p99_ms:g} ms" if slo_p99_ms else "the SLO"
    out: dict[str, Any] = {
        "source": "search",
        "slo_p99_ms": slo_p99_ms,
        "method": "ceil(rate / capacity at the SLO) replicas per side, idle capacity paid: cost per 1k = "
        "replicas x price per hour / (rate x 3.6); the crossover is computed on both sides' replica "
        "steps, its interval from the capacity brackets (best throughput that held, first rate that missed)",
        "crossover_rps": None,
        "crossover_interval_rps": [None, None],
        "first_cheaper_rps": None,
        "wins_at_every_higher_rate": None,
    }
    bounds = {name: _bounds(sides[name].get("capacity") or {}) for name in SIDES}
    floors = {name: bool((sides[name].get("capacity") or {}).get("reached_floor")) for name in SIDES}
    prices = {name: sides[name].get("price_per_hour") for name in SIDES}
    caps = [b[1] for b in bounds.values() if b] + [b[2] for b in bounds.values() if b and math.isfinite(b[2])]
    lo_r = min(caps, default=1.0) / 8
    hi_r = max(caps, default=100.0) * 8
    cross = None
    if all(bounds.values()) and all(p for p in prices.values()):
        (bl, bp, bh), (tl, tp, th) = bounds["baseline"], bounds["treatment"]  # type: ignore[misc]
        pb, pt = float(prices["baseline"]), float(prices["treatment"])  # type: ignore[arg-type]
        cross = pricing.crossing(bp, pb, tp, pt)
        _, _, interval = pricing.crossing_interval((bl, bh), pb, (tl, th), pt)
        out["crossover_interval_rps"] = interval
        out["crossover_rps"] = cross.from_rps
        out["first_cheaper_rps"] = cross.first_rps
        out["approximate"] = cross.approximate
        far = [x for x in (cross.from_rps, *interval) if x]
        hi_r = max(hi_r, *(2 * x for x in far)) if far else hi_r
    rates = _grid(lo_r, hi_r)
    out["rates_rps"] = rates
    for name in SIDES:
        s = dict(sides[name])
        b, price = bounds[name], prices[name]
        if b and price:
            s["capacity_rps"] = b[1]
            s["replicas"] = [pricing.replicas(r, b[1]) for r in rates]
            s["cost_per_1k"] = [_cost(r, b[1], price) for r in rates]
            s["cost_per_1k_high"] = [_cost(r, b[0], price) for r in rates]
            s["cost_per_1k_low"] = [_cost(r, b[2], price) for r in rates]
        else:
            s["capacity_rps"] = None
            s["replicas"] = s["cost_per_1k"] = s["cost_per_1k_high"] = s["cost_per_1k_low"] = [None] * len(
                rates
            )
        out[name] = s
    bc, tc = out["baseline"]["cost_per_1k"], out["treatment"]["cost_per_1k"]
    out["treatment_cheaper"] = [
        (t < b) if t is not None and b is not None else None for t, b in zip(tc, bc, strict=True)
    ]

    def who(name: str) -> str:
        return f"the {name} ({sides[name].get('device') or '?'})"

    def cannot(name: str) -> str:
        floor = (sides[name].get("capacity") or {}).get("floor_rps")
        return f"{who(name)} cannot meet {slo} at any rate >= {floor:g} req/s"

    if floors["baseline"] and floors["treatment"]:
        out["outcome"] = "neither"
        out["reason"] = f"{cannot('baseline')}, and {cannot('treatment')}: neither side meets this SLO"
    elif floors["baseline"] and bounds["treatment"]:
        out["outcome"] = "only_treatment"
        out["reason"] = f"{cannot('baseline')}: {who('treatment')} is the only way to meet this SLO"
    elif floors["treatment"] and bounds["baseline"]:
        out["outcome"] = "only_baseline"
        out["reason"] = f"{cannot('treatment')}: {who('baseline')} is the only way to meet this SLO"
    elif cross is None:
        why = [
            f"{who(n)} has no price per hour"
            if not prices[n]
            else f"{who(n)}'s capacity at {slo} is unknown (no search finished for it)"
            for n in SIDES
            if not (bounds[n] and prices[n])
        ]
        out["outcome"] = "inconclusive"
        out["reason"] = "; ".join(why)
    else:
        b, t = out["baseline"], out["treatment"]
        unit = (
            f"{t['price_per_hour']:g}/h per {b_fmt(bounds['treatment'])} req/s vs "
            f"{b['price_per_hour']:g}/h per {b_fmt(bounds['baseline'])} req/s"
        )
        lo, hi = out["crossover_interval_rps"]
        if cross.from_rps is None:
            out["outcome"] = "never"
            out["reason"] = (
                f"the treatment is never cheaper for good: it costs more per req/s of capacity ({unit})"
                + (
                    f"; it is cheaper only between replica steps, first at {cross.first_rps:.4g} req/s"
                    if cross.first_rps is not None
                    else ""
                )
                + ("" if lo is None else f" (with the brackets' best case it would win from {lo:.4g} req/s)")
            )
        else:
            out["outcome"] = "crossover"
            out["wins_at_every_higher_rate"] = True
            span = (
                f"interval [{lo:.4g}, {'unbounded' if hi is None else f'{hi:.4g}'}] req/s "
                "from the capacity brackets"
                if lo is not None
                else "interval unknown"
            )
            out["reason"] = (
                "the treatment is cheaper per 1k at the SLO at every rate"
                if cross.from_rps == 0
                else "the treatment is cheaper per 1k at the SLO at every rate above "
                f"{cross.from_rps:.4g} req/s"
            ) + f" ({span}; {unit})"
    return out


def b_fmt(b: tuple[float, float, float] | None) -> str:
    """A capacity with its bracket: ``120 [120, 131)``."""
    if b is None:
        return "?"
    hi = "inf" if math.isinf(b[2]) else f"{b[2]:.4g}"
    return f"{b[1]:.4g} [{b[0]:.4g}, {hi})"


def line(c: dict[str, Any]) -> str:
    """The verdict's one line about the crossover."""
    t, b = c.get("treatment") or {}, c.get("baseline") or {}
    who = f"treatment {t.get('device') or '?'} vs baseline {b.get('device') or '?'}"
    lo, hi = (c.get("crossover_interval_rps") or [None, None])[:2]
    if c.get("outcome") == "crossover" and c.get("source") == "search":
        span = f" [{lo:.4g}, {'unbounded' if hi is None else f'{hi:.4g}'}]" if lo is not None else ""
        head = f"CROSSOVER at {c['crossover_rps']:.4g} req/s{span}"
    elif c.get("outcome") == "crossover":
        head = f"CROSSOVER at {_rate(c['crossover_rps'])}"
    elif c.get("outcome") == "not_within_rates":  # the reason starts with the words: said once
        return f"CROSSOVER: {c.get('reason')} ({who})"
    elif c.get("outcome") == "never":
        head = "CROSSOVER: NONE (the treatment never wins for good)"
    elif c.get("outcome") in ("only_baseline", "only_treatment", "neither"):
        only = {"only_baseline": "only the baseline", "only_treatment": "only the treatment"}
        head = f"CROSSOVER: NONE ({only.get(c['outcome'], 'neither side')} meets the SLO)"
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
    dense = len(rates) > 12  # a computed curve: ticks at round rates, no marker per point
    if dense:
        xt = [10**t for t in svg.log_ticks(x0, x1)] if logx else [r for r in rates[:: len(rates) // 6]]
        out += [svg.x_label(sx(r), row, f"{r:g}") for r in xt]
    else:
        out += [svg.x_label(sx(r), row, n) for r, n in zip(rates, xnames, strict=True)]
    lo_hi = c.get("crossover_interval_rps") or [None, None]
    if lo_hi[0] is not None:  # the crossover's interval from the capacity brackets, shaded
        a = sx(max(lo_hi[0], rates[0]))
        e = sx(min(lo_hi[1], rates[-1])) if lo_hi[1] is not None else fr.right
        out.append(
            f'<rect x="{a:.1f}" y="{fr.top:.1f}" width="{max(e - a, 1.0):.1f}" '
            f'height="{fr.bottom - fr.top:.1f}" fill="#2ca02c" fill-opacity="0.12">'
            "<title>crossover interval</title></rect>"
        )
    names = []
    for i, (name, s) in enumerate(series.items()):
        color = svg.COLORS[i % len(svg.COLORS)]
        if s:
            out.append(svg.polyline([(sx(x), sy(y)) for x, y in s], color))
        out += [
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
            f"<title>{svg.escape(name)} at {x:g} req/s: {y:.6g} per 1k</title></circle>"
            for x, y in (s if not dense else [])
        ]
        label = name if s else f"{name}: capacity unknown (held the SLO at no rate tried)"
        if s and dense:
            label += f": capacity {b_fmt(_bounds(c[name.split()[0]].get('capacity') or {}))} req/s"
        elif not s and (c[name.split()[0]].get("capacity") or {}).get("reached_floor"):
            label = f"{name}: meets the SLO at no rate down to its floor"
        names.append(label)
    cross = c.get("crossover_rps")
    if cross == 0:
        note = "the treatment is cheaper at every rate"
    elif cross is not None:
        x = sx(cross)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{fr.top:.1f}" y2="{fr.bottom:.1f}" stroke="#2ca02c" '
            'stroke-width="1.5" stroke-dasharray="4 3"/>'
        )
        at = f"{cross:g}" if not dense else f"{cross:.4g}"
        span = "" if lo_hi[0] is None or not dense else ", interval shaded"
        note = f"crossover at {at} req/s (dashed{span})"
    else:
        words = {
            "not_within_rates": "not within the rates tried",
            "never": "none: the treatment never wins for good",
            "only_baseline": "none: only the baseline meets the SLO",
            "only_treatment": "none: only the treatment meets the SLO",
            "neither": "none: neither side meets the SLO",
        }.get(str(c.get("outcome")), "inconclusive")
        note = f"crossover: {words}"
    foot, height = fr.foot(row, names, notes=[note])
    return fr.finish(out + foot, height)


def figure(c: dict[str, Any]) -> str:
    """The chart and, under it, the verdict's crossover line (the inside of an HTML ``<figure>``)."""
    return plot(c) + f"<figcaption style='max-width:640px'>{svg.escape(line(c))}</figcaption>"
