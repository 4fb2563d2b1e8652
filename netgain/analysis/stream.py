"""A large run's figures from requests.parquet read in row-group sized chunks, in bounded memory.

The in-memory path holds every row (about 230 bytes each); past ``STREAM_ABOVE_ROWS`` rows the
report reads the file a few times instead, holding a chunk at a time:

1. counts, windows, the throughput and arrival bins, sums for the means, and each population's
   first-pass histogram (``netgain.stats.select``: the latencies, send lag, service time and
   every phase);
2. the values of only the histogram buckets holding a wanted rank (percentiles, the bootstrap's
   ranks, the enough-samples bound, the median band, the CDF's points), counted again more finely
   where a bucket is too large to keep; the drift's two halves start here (their split is known
   after pass 1); the tail attribution's sums, rows clear of the p99, p99.9 and median-band
   buckets at once, the few inside them kept until those values are exact at the pass's end;
3. the buckets counted again, the drift's medians (only the latency columns are read); the tail
   sums here instead when pass 2 could not keep those four buckets.

Order statistics, counts and bootstrap draws equal the in-memory path's; means are sums over
counts, equal to numpy's pairwise means to the last bits or so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from netgain.analysis import stats
from netgain.analysis.coverage import gaps_from_counts
from netgain.analysis.figures import Figures, cdf_ranks, latency_cdf, window
from netgain.analysis.stream_reader import Chunk, Reader
from netgain.analysis.tail import BAND, TAIL_PHASES, TailSums, attribute, phase_matrix
from netgain.contract import rundir as files
from netgain.contract.phases import PHASES
from netgain.stats.select import Selector

STREAM_ABOVE_ROWS = 5_000_000  # runs up to this many rows are read whole (faster; ~1.2 GB peak)
SELECT_BUDGET = 4_000_000  # values kept per population and pass: 32 MB each, about 15 populations
FOLD_ROWS = 2_000_000  # rows pass 2 may keep whole to sum the tail without a pass of its own
PHASE_STATS_Q = (0.5, 0.9, 0.99, 1.0)  # stats.phase_stats' quantiles


def streams(run_dir: str | Path, span_log: str | Path | None) -> bool:
    """Whether ``analyze`` reads this run in chunks: past ``STREAM_ABOVE_ROWS`` rows, without a span
    log to join (the join matches every row's id). A file it cannot open is left to the in-memory
    path, which says what is wrong with it."""
    if span_log is not None:
        return False
    try:
        return int(pq.ParquetFile(Path(run_dir) / files.REQUESTS).metadata.num_rows) > STREAM_ABOVE_ROWS
    except (pa.ArrowException, OSError):
        return False


_PHASE_KEYS = (*PHASES, "network", "send_lag", "other", "server_total")


class _Run:
    """Every pass's work over the chunks; ``figures`` drives the passes."""

    def __init__(self, t0: float, t1: float, bootstrap: int) -> None:
        self.t0, self.t1 = t0, t1
        self.bootstrap = bootstrap
        self.rows = self.warmup = self.completed = 0
        self.status_counts = np.zeros(0, np.int64)
        self.dropped = 0
        self.n_bins = max(1, int(np.ceil(max(t1 - t0, 1e-9))))
        self.done_bins = np.zeros(self.n_bins, np.int64)
        self.arrivals = np.zeros(1, np.int64)
        self.sched_max: float | None = None
        self.ok_t = [np.inf, -np.inf]
        self.batch_sum, self.batch_n = 0.0, 0
        self.missing_total = self.answered = self.timed = 0
        self.lat, self.send_lag, self.service = (Selector(SELECT_BUDGET) for _ in range(3))
        self.phase = {k: Selector(SELECT_BUDGET) for k in _PHASE_KEYS}
        self.halves: tuple[Selector, Selector] | None = None
        self.mid = 0.0
        self.tail: TailSums | None = None
        self.tail_done = False
        self.fold: _Fold | None = None

    def first(self, c: Chunk, reader: Reader) -> None:
        self.rows += len(c.code)
        self.warmup += int(c.warm.sum())
        measured = c.measured
        counts = np.bincount(c.code[measured], minlength=len(reader.status_names))
        if len(counts) > len(self.status_counts):
            self.status_counts = np.concatenate(
                [self.status_counts, np.zeros(len(counts) - len(self.status_counts), np.int64)]
            )
        self.status_counts[: len(counts)] += counts
        self.dropped += int((c.code == reader.status_id("DROPPED")).sum())
        if len(c.scheduled_s):
            m = float(c.scheduled_s.max())
            self.sched_max = m if self.sched_max is None else max(self.sched_max, m)
            idx = np.clip(c.scheduled_s.astype(np.int64), 0, None)
            self._arrive(np.bincount(idx))
        ok = c.ok
        ok_any = (c.code == reader.status_id("OK")) & ~np.isnan(c.latency)
        done_s = c.scheduled_s + c.latency / 1e3
        done = ok_any & (done_s >= self.t0) & (done_s < self.t1)
        self.completed += int(done.sum())
        rel = np.clip((done_s[done] - self.t0).astype(np.int64), 0, self.n_bins - 1)
        self.done_bins += np.bincount(rel, minlength=self.n_bins)[: self.n_bins]
        if ok.any():
            t_ok = c.scheduled_s[ok]
            self.ok_t = [min(self.ok_t[0], float(t_ok.min())), max(self.ok_t[1], float(t_ok.max()))]
        b = c.batch[ok]
        known = ~np.isnan(b)
        self.batch_sum += float(b[known].sum())
        self.batch_n += int(known.sum())
        total_ok = c.total[ok]
        self.missing_total += int(np.isnan(total_ok).sum())
        answered = measured & ~np.isnan(c.latency)
        self.answered += int(answered.sum())
        self.timed += int((~np.isnan(c.total[answered])).sum())

    def _arrive(self, counts: np.ndarray) -> None:
        if len(counts) > len(self.arrivals):
            self.arrivals = np.concatenate(
                [self.arrivals, np.zeros(len(counts) - len(self.arrivals), np.int64)]
            )
        self.arrivals[: len(counts)] += counts

    def full(self) -> bool:
        """Whether the next pass needs the phases and send times, not only the latencies."""
        rest = [self.send_lag, self.service, *self.phase.values()]
        tail = self.fold is not None or (self.tail is not None and not self.tail_done)
        return not all(s.done for s in rest) or tail

    def every(self, c: Chunk) -> None:
        """Each pass: the selectors that still need values, the drift halves and the tail sums."""
        ok = c.ok
        lat = c.latency[ok]
        if not self.lat.done:
            self.lat.add(lat)
        if not self.send_lag.done:
            self.send_lag.add(c.send_lag[c.measured & ~np.isnan(c.send_lag)])
        if not self.service.done:
            self.service.add(c.service[ok])
        pending = [k for k, s in self.phase.items() if not s.done]
        if pending:
            cols = self._cols(c, ok)
            for k in pending:
                self.phase[k].add(cols[k])
        if self.tail is not None and not self.tail_done:
            keep = self.tail.keep(lat)
            rows = np.flatnonzero(ok)[keep]
            tail_cols = self._cols(c, rows)
            del tail_cols["server_total"]
            self.tail.add(lat[keep], tail_cols, c.batch[rows])
        if self.fold is not None:
            self.fold.add(lat, np.flatnonzero(ok), c)
        if self.halves is not None:
            t = c.scheduled_s[ok]
            first = t < self.mid
            self.halves[0].add(lat[first])
            self.halves[1].add(lat[~first])

    @staticmethod
    def _cols(c: Chunk, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The attribution phases (and the server total) of the selected rows."""
        named = {p: c.phases[p][rows] for p in PHASES}
        cols = phase_matrix(named, c.total[rows], c.service[rows], c.send_lag[rows])
        cols["server_total"] = c.total[rows]
        return cols

    def all_done(self) -> bool:
        sels = [self.lat, self.send_lag, self.service, *self.phase.values(), *(self.halves or ())]
        return all(s.done for s in sels) and (self.tail_done or not self.lat.n)


def _want_summary(sel: Selector) -> None:
    """The ranks ``stats.summarize`` reads: p50..p99.9 and the maximum (NaN values sort last)."""
    n = sel.total
    sel.want([stats.rank(n, q) for q in stats.QUANTILES.values()] + ([n - 1] if n else []))


def _sorted(sel: Selector) -> np.ndarray:
    """``Sorted`` typed as the array it stands in for."""
    return cast(np.ndarray, Sorted(sel))


class Sorted:
    """The wanted ranks of a finished ``Selector`` read like a sorted array (``summarize``,
    ``enough_samples``, ``latency_cdf`` and ``bootstrap_quantile`` index only those)."""

    def __init__(self, sel: Selector) -> None:
        self.sel = sel

    def __len__(self) -> int:
        return self.sel.total

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, np.ndarray):
            return np.array([self.sel.value(int(j) % len(self)) for j in i], dtype=np.float64)
        return self.sel.value(int(i) % len(self))


def _phase_stats(sel: Selector) -> dict[str, float | None]:
    """``stats.phase_stats`` of the population (its NaNs ignored)."""
    n = sel.n
    if not n:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None, "n": 0}
    p50, p90, p99, top = (sel.value(stats.rank(n, q)) for q in PHASE_STATS_Q)
    return {"mean": sel.sum / n, "p50": p50, "p90": p90, "p99": p99, "max": top, "n": n}


def _plan(run: _Run, rng: np.random.Generator) -> np.ndarray:
    """After pass 1: the ranks every population needs; returns the p99 bootstrap's ranks (drawn
    from ``rng`` first, as the in-memory path draws them)."""
    n = run.lat.n
    boot = stats.bootstrap_ranks(n, 0.99, run.bootstrap, rng)
    _want_summary(run.lat)
    urgent = [stats.rank(n, q) for q in (BAND[0], BAND[1], 0.99, 0.999)] if n else []
    run.lat.want(urgent, urgent=True)
    run.lat.want(boot.tolist())
    run.lat.want(cdf_ranks(n).tolist())
    for q in (0.99, 0.999):
        k = stats.upper_bound_rank(n, q)
        if k is not None:
            run.lat.want([k - 1])
    _want_summary(run.send_lag)
    _want_summary(run.service)
    for sel in run.phase.values():
        sel.want([stats.rank(sel.n, q) for q in PHASE_STATS_Q] if sel.n else [])
    return boot


def _start_tail(run: _Run) -> None:
    """Once p99, p99.9 and the median band are exact, the next pass sums the tail attribution."""
    n = run.lat.n
    s = Sorted(run.lat)
    band = (s[stats.rank(n, BAND[0])], s[stats.rank(n, BAND[1])])
    run.tail = TailSums({"p99": s[stats.rank(n, 0.99)], "p999": s[stats.rank(n, 0.999)]}, band)


class _Fold:
    """Pass 2's tail sums, while p99, p99.9 and the median band are known only to a bucket each:
    rows outside those buckets fall on the same side of the value as of the bucket, so they are
    summed at once; the few rows inside one are kept whole until the pass ends."""

    def __init__(self, brackets: list[tuple[float, float, bool]]) -> None:
        (_, hi45, _), (lo55, _, _), (_, hi99, _), (_, hi999, _) = brackets
        self.open = [(lo, hi) for lo, hi, exact in brackets if not exact]
        self.sums = TailSums({"p99": hi99, "p999": hi999}, (hi45, lo55))
        self.kept: list[tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]] = []

    def add(self, lat: np.ndarray, ok_rows: np.ndarray, c: Chunk) -> None:
        unsure = np.zeros(len(lat), dtype=bool)
        for lo, hi in self.open:
            unsure |= (lat >= lo) & (lat <= hi)
        sure = self.sums.keep(lat) & ~unsure
        for sel, out in ((sure, None), (unsure, self.kept)):
            if not sel.any():
                continue
            rows = ok_rows[sel]
            cols = _Run._cols(c, rows)
            del cols["server_total"]
            if out is None:
                self.sums.add(lat[sel], cols, c.batch[rows])
            else:
                out.append((lat[sel], cols, c.batch[rows]))

    def finish(self, exact: TailSums) -> TailSums:
        """The kept rows under the exact thresholds, plus the sums made before."""
        for lat, cols, batch in self.kept:
            exact.add(lat, cols, batch)
        exact.merge(self.sums)
        return exact


def _fold(run: _Run) -> _Fold | None:
    """A fold for pass 2 when the pass ends with the four values exact and their buckets' rows fit."""
    n = run.lat.n
    if not n:
        return None
    brackets = [run.lat.bracket(r) for r in _urgent(n)]
    if any(b is None for b in brackets):
        return None
    known = [b for b in brackets if b is not None]
    if sum(b[2] for b in known) > FOLD_ROWS or any(np.isnan(b[1]) for b in known):
        return None
    return _Fold([(lo, hi, count == 0) for lo, hi, count in known])


def _finish_pass(run: _Run) -> None:
    """Close a pass for every population; the drift halves want their medians after their first."""
    for sel in (run.lat, run.send_lag, run.service, *run.phase.values()):
        sel.next_pass()
    for h in run.halves or ():
        if h.passes == 0:
            h.want([stats.rank(h.n, 0.5)] if h.n else [])
        h.next_pass()


def figures(
    run_dir: str | Path,
    meta: dict[str, Any],
    warmup_s: float | None,
    bootstrap: int,
    rng: np.random.Generator,
) -> Figures:
    """``run_summary``'s figures for a run read in chunks (see the module's docstring)."""
    reader = Reader(run_dir, warmup_s)
    cfg, trace = meta.get("config") or {}, meta.get("trace") or {}
    top = None if cfg.get("duration_s") or trace.get("duration_s") else reader.scheduled_max()
    t0, t1 = window(meta, np.array([top]) if top is not None else np.zeros(0), warmup_s)
    if meta.get("interrupted_at_s") is not None:  # measured up to the Ctrl-C, as run_summary does
        reader.cut_s = t1
    run = _Run(t0, t1, bootstrap)
    for c in reader.chunks(full=True):
        run.first(c, reader)
        run.every(c)
    boot = _plan(run, rng)  # rng: the p99 bootstrap's ranks first, then the throughput's bins
    thr = run.completed / max(t1 - t0, 1e-9)
    thr_draws = stats.bootstrap_rate(run.done_bins.astype(np.float64), 1.0, bootstrap, rng)
    if len(thr_draws) and run.done_bins.mean() > 0:
        thr_draws = thr_draws * (thr / run.done_bins.mean())
    _finish_pass(run)
    if run.lat.n >= 4:
        run.mid = (run.ok_t[0] + run.ok_t[1]) / 2
        run.halves = (Selector(SELECT_BUDGET), Selector(SELECT_BUDGET))
    run.fold = _fold(run)
    while True:
        if run.tail is None and run.fold is None and run.lat.n and run.lat.known(_urgent(run.lat.n)):
            _start_tail(run)
        if run.all_done():
            break
        summing = run.tail is not None and not run.tail_done
        for c in reader.chunks(full=run.full()):
            run.every(c)
        run.tail_done = run.tail_done or summing
        _finish_pass(run)
        if run.fold is not None:
            _start_tail(run)
            assert run.tail is not None
            run.tail, run.fold, run.tail_done = run.fold.finish(run.tail), None, True
    return _assemble(run, reader, meta, boot, thr, thr_draws)


def _urgent(n: int) -> list[int]:
    """The latency ranks the tail attribution waits on: the median band's ends, p99 and p99.9."""
    return [stats.rank(n, q) for q in (BAND[0], BAND[1], 0.99, 0.999)]


def _assemble(
    run: _Run, reader: Reader, meta: dict[str, Any], boot: np.ndarray, thr: float, thr_draws: np.ndarray
) -> Figures:
    names = reader.status_names
    counts = np.concatenate(
        [run.status_counts, np.zeros(max(0, len(names) - len(run.status_counts)), np.int64)]
    )
    statuses = {name: int(c) for name, c in zip(names, counts, strict=True) if c}
    n_measured = int(counts.sum())
    n_ok = statuses.get("OK", 0)
    st = {
        "statuses": statuses,
        "n_measured": n_measured,
        "n_ok": n_ok,
        "errors": {k: v for k, v in statuses.items() if k != "OK"},
        "dropped": max(run.dropped, int((meta.get("counts") or {}).get("dropped") or 0)),
        "error_rate": (n_measured - n_ok) / n_measured if n_measured else None,
    }
    n = run.lat.n
    lat = _sorted(run.lat)
    latency = stats.summarize(lat)
    latency["mean"] = run.lat.sum / n if n else None
    service = stats.summarize(_sorted(run.service))
    phases_ms: dict[str, Any] = {k: _phase_stats(run.phase[k]) for k in _PHASE_KEYS}
    phases_ms["service"] = service
    if run.tail is not None:
        tail = run.tail.result()
    else:
        empty = np.zeros(0)
        tail = attribute(
            empty, dict.fromkeys(TAIL_PHASES, empty), empty, {"p99": None, "p999": None}, (0.0, 0.0)
        )
    drift = stats.drift_of(None, None)
    if run.halves is not None and run.halves[0].n and run.halves[1].n:
        a, b = run.halves
        drift = stats.drift_of(a.value(stats.rank(a.n, 0.5)), b.value(stats.rank(b.n, 0.5)))
    n_bins = max(1, math.ceil(run.t1 - 1e-9), int((run.sched_max or 0.0) // 1.0) + 1)
    arrivals = np.zeros(n_bins, np.int64)
    arrivals[: len(run.arrivals)] += run.arrivals[:n_bins]
    return Figures(
        rows=run.rows,
        warmup=run.warmup,
        t0=run.t0,
        t1=run.t1,
        statuses=st,
        latency=latency,
        p99_draws=np.asarray(lat[boot], dtype=np.float64) if len(boot) else np.empty(0),
        enough={"p99": stats.enough_samples(lat, 0.99), "p999": stats.enough_samples(lat, 0.999)},
        send_lag=stats.summarize(_sorted(run.send_lag)),
        service=service,
        throughput=thr,
        completed=run.completed,
        thr_draws=thr_draws,
        phases_ms=phases_ms,
        tail=tail,
        drift=drift,
        batch_size_mean=run.batch_sum / run.batch_n if run.batch_n else None,
        offered=n_measured,
        arrival_rate=arrivals.astype(np.float64) if run.rows else np.zeros(0),
        gaps=gaps_from_counts(n, run.missing_total, run.answered, run.timed, meta),
        latency_cdf=latency_cdf(lat),
        streamed=True,
    )
