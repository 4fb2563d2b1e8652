"""Tail attribution: which phase makes slow requests slow.

A request's latency splits exactly into send_lag + network + server phases (+ ``other``,
the server total not covered by a named phase). For the requests at or above p99 (and
p99.9) we take each phase's mean, its share of their mean latency, and its *excess* over
the typical request (mean of the requests between p45 and p55). The phase with the largest
excess is ``dominant``: it is the one to fix, even when another phase is larger in both. Without
the server's trailer no phase but the client-side send lag is known: ``dominant`` is then None.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netgain.contract.phases import PHASES

TAIL_PHASES = (*PHASES, "network", "send_lag", "other")
# Measured by the client alone: the load generator's delay before sending, not the server's time.
CLIENT_PHASES = ("send_lag",)
BAND = (0.45, 0.55)


def batch_entry(r: dict[str, Any]) -> dict[str, Any]:
    """One batch size's line of the tail attribution: its count, dominant phase and excess per phase."""
    return {
        "n": r["n"],
        "dominant": r["dominant"],
        "excess_ms": {p: v["excess_ms"] for p, v in r["phases"].items()},
    }


def phase_matrix(
    phases: dict[str, np.ndarray],
    server_total_ms: np.ndarray,
    service_ms: np.ndarray,
    send_lag_ms: np.ndarray,
) -> dict[str, np.ndarray]:
    """All attribution phases for the given rows (arrays already subset)."""
    named = np.zeros_like(service_ms)
    for p in PHASES:
        named += np.nan_to_num(phases[p])
    out = {p: phases[p] for p in PHASES}
    out["network"] = service_ms - server_total_ms
    out["send_lag"] = send_lag_ms
    other = server_total_ms - named
    # Below a nanosecond (the clocks' resolution) the difference is float rounding, not time.
    other = np.where(np.abs(other) < 1e-6, 0.0, other)
    out["other"] = np.where(np.isnan(server_total_ms), np.nan, other)
    return out


def _means(cols: dict[str, np.ndarray], sel: np.ndarray) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for p in TAIL_PHASES:
        v = cols[p][sel]
        v = v[~np.isnan(v)]
        out[p] = float(v.mean()) if len(v) else None
    return out


def _attribute(
    cols: dict[str, np.ndarray], latency: np.ndarray, tail_sel: np.ndarray, band_sel: np.ndarray
) -> dict[str, Any]:
    n = int(tail_sel.sum())
    if n == 0 or not band_sel.any():
        return {"n": n, "dominant": None, "phases": {}}
    return _attributed(
        n,
        _means(cols, tail_sel),
        _means(cols, band_sel),
        float(latency[tail_sel].mean()),
        float(latency[band_sel].mean()),
    )


def _attributed(
    n: int,
    tail_mean: dict[str, float | None],
    typ_mean: dict[str, float | None],
    tail_lat: float,
    band_lat: float,
) -> dict[str, Any]:
    """The attribution of ``n`` tail requests from their phases' means and the typical request's."""
    rows: dict[str, dict[str, float | None]] = {}
    best, best_excess = None, -np.inf
    for p in TAIL_PHASES:
        t, m = tail_mean[p], typ_mean[p]
        excess = t - m if t is not None and m is not None else None
        rows[p] = {
            "tail_mean_ms": t,
            "median_mean_ms": m,
            "excess_ms": excess,
            "share": t / tail_lat if t is not None and tail_lat > 0 else None,
        }
        if excess is not None and excess > best_excess:
            best, best_excess = p, excess
    if all(rows[p]["excess_ms"] is None for p in TAIL_PHASES if p not in CLIENT_PHASES):
        # No server-timing trailer on these rows: the client's own send lag alone is no attribution.
        best = None
    return {
        "n": n,
        "latency_mean_ms": tail_lat,
        "median_latency_mean_ms": band_lat,
        "dominant": best,
        "phases": rows,
    }


def attribute(
    latency: np.ndarray,
    cols: dict[str, np.ndarray],
    batch_size: np.ndarray,
    thresholds: dict[str, float | None],
    band_ms: tuple[float, float],
) -> dict[str, Any]:
    """Attribution at each threshold (``p99``, ``p999``), overall and per server batch size.

    ``latency`` and every array in ``cols`` cover the same rows: measured, successful requests.
    """
    band = (latency >= band_ms[0]) & (latency <= band_ms[1])
    cuts = [t for t in thresholds.values() if t is not None]
    # Only the median band and the tail matter: subset once so the per-batch loops stay small.
    keep = band | (latency >= min(cuts)) if cuts else band
    latency, band, batch_size = latency[keep], band[keep], batch_size[keep]
    cols = {k: v[keep] for k, v in cols.items()}
    out: dict[str, Any] = {"median_band": [BAND[0], BAND[1]], "median_band_ms": list(band_ms)}
    sizes = np.unique(batch_size[~np.isnan(batch_size)])
    for name, thr in thresholds.items():
        if thr is None:
            out[name] = {"n": 0, "dominant": None, "phases": {}}
            continue
        sel = latency >= thr
        res = _attribute(cols, latency, sel, band)
        res["threshold_ms"] = thr
        per_batch: dict[str, Any] = {}
        for s in sizes:
            of_size = batch_size == s
            tail_s = sel & of_size
            if not tail_s.any():
                continue
            # the typical request of the same batch size, so batch-level costs do not masquerade as tail
            band_s = band & of_size
            r = _attribute(cols, latency, tail_s, band_s if band_s.any() else band)
            per_batch[str(int(s))] = batch_entry(r)
        res["by_batch_size"] = per_batch
        out[name] = res
    out["dominant"] = out.get("p99", {}).get("dominant")
    return out


class TailSums:
    """``attribute``'s figures from rows streamed in chunks: per selection (the median band, each
    threshold's tail) and batch size, the rows' count and the sums behind each mean. Means are
    these sums over counts, so they can differ from ``attribute``'s in the last bits."""

    def __init__(self, thresholds: dict[str, float | None], band_ms: tuple[float, float]) -> None:
        self.thresholds = thresholds
        self.band_ms = band_ms
        # (selection, batch size or None for all) -> [rows, latency sum, per phase: sum, count]
        self.acc: dict[tuple[str, float | None], np.ndarray] = {}

    def keep(self, latency: np.ndarray) -> np.ndarray:
        """The rows ``add`` counts (the median band and the lowest threshold's tail): pass only
        those to spare building every row's phases."""
        band = (latency >= self.band_ms[0]) & (latency <= self.band_ms[1])
        cuts = [t for t in self.thresholds.values() if t is not None]
        return np.asarray(band | (latency >= min(cuts))) if cuts else band

    def add(self, latency: np.ndarray, cols: dict[str, np.ndarray], batch_size: np.ndarray) -> None:
        band = (latency >= self.band_ms[0]) & (latency <= self.band_ms[1])
        sels = {"band": band}
        sels.update({k: latency >= t for k, t in self.thresholds.items() if t is not None})
        values = np.stack([latency, *(cols[p] for p in TAIL_PHASES)])
        for name, sel in sels.items():
            if not sel.any():
                continue
            v, b = values[:, sel], batch_size[sel]
            self._add((name, None), v)
            for s in np.unique(b[~np.isnan(b)]):
                self._add((name, float(s)), v[:, b == s])

    def merge(self, other: TailSums) -> None:
        """Add another's sums (rows it counted, under its thresholds) to these."""
        for key, row in other.acc.items():
            self._add_row(key, row)

    def _add(self, key: tuple[str, float | None], v: np.ndarray) -> None:
        known = ~np.isnan(v[1:])
        row = np.concatenate(
            [[v.shape[1], v[0].sum()], np.where(known, v[1:], 0.0).sum(axis=1), known.sum(axis=1)]
        )
        self._add_row(key, row)

    def _add_row(self, key: tuple[str, float | None], row: np.ndarray) -> None:
        if key in self.acc:
            self.acc[key] = self.acc[key] + row
        else:
            self.acc[key] = row.copy()

    def _of(self, key: tuple[str, float | None]) -> tuple[int, dict[str, float | None], float]:
        a = self.acc[key]
        k = len(TAIL_PHASES)
        sums, counts = a[2 : 2 + k], a[2 + k :]
        means = {p: float(sums[i] / counts[i]) if counts[i] else None for i, p in enumerate(TAIL_PHASES)}
        return int(a[0]), means, float(a[1] / a[0])

    def _attr(self, tail: tuple[str, float | None], band: tuple[str, float | None]) -> dict[str, Any]:
        if tail not in self.acc:
            return {"n": 0, "dominant": None, "phases": {}}
        n, tail_mean, tail_lat = self._of(tail)
        if band not in self.acc:
            return {"n": n, "dominant": None, "phases": {}}
        _, typ_mean, band_lat = self._of(band)
        return _attributed(n, tail_mean, typ_mean, tail_lat, band_lat)

    def result(self) -> dict[str, Any]:
        """What ``attribute`` returns for the same rows."""
        out: dict[str, Any] = {"median_band": [BAND[0], BAND[1]], "median_band_ms": list(self.band_ms)}
        for name, thr in self.thresholds.items():
            if thr is None:
                out[name] = {"n": 0, "dominant": None, "phases": {}}
                continue
            res = self._attr((name, None), ("band", None))
            res["threshold_ms"] = thr
            per_batch: dict[str, Any] = {}
            sizes = sorted(s for (sel, s) in self.acc if sel == name and s is not None)
            for s in sizes:
                band_key = ("band", s) if ("band", s) in self.acc else ("band", None)
                r = self._attr((name, s), band_key)
                per_batch[str(int(s))] = batch_entry(r)
            res["by_batch_size"] = per_batch
            out[name] = res
        out["dominant"] = out.get("p99", {}).get("dominant")
        return out
