"""The Azure Functions trace 2019 (``invocations_per_function_md.anon.dNN.csv``): per-minute counts.

Each row is one function (``HashOwner, HashApp, HashFunction, Trigger``) and 1440 columns ``1`` ..
``1440``, the invocations in each minute of one day. A count of c in minute m becomes c arrivals
inside [(m-1)*60, m*60) s: ``uniform`` draws each at random (numpy's generator seeded with
``seed``: the same file and seed, the same trace), ``even`` spaces them (k + 0.5) * 60 / c s into
the minute. The trace has no payload sizes (size 0, the model's default); the durations and memory
files of the dataset are not needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from netgain.loadgen.traces.io import csv_header, csv_locator, whole_numbers
from netgain.loadgen.traces.model import TraceError
from netgain.loadgen.traces.public.base import Imported, failer, read_csv_columns, sorted_import

MINUTES = 1440
SPREADS = ("uniform", "even")
ID_COLUMNS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
#: More arrivals than this would take gigabytes: the error says how to take part of the file.
MAX_ARRIVALS = 50_000_000


def spread_minutes(
    counts: Sequence[np.ndarray], spread: str, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals from per-minute counts: ``counts[m][f]`` invocations of function f in minute m
    (0-based). Returns (seconds from the start of minute 0, function index), in minute order."""
    if spread not in SPREADS:
        raise ValueError(f"spread {spread!r}: use {' or '.join(SPREADS)}")
    times: list[np.ndarray] = []
    funcs: list[np.ndarray] = []
    for m, c in enumerate(counts):
        c = np.asarray(c, dtype=np.int64)
        nz = np.flatnonzero(c)
        if not nz.shape[0]:
            continue
        reps = c[nz]
        n = int(reps.sum())
        if spread == "uniform":
            within = rng.random(n) * 60.0
        else:
            first = np.repeat(np.cumsum(reps) - reps, reps)  # index of each cell's first arrival
            per = np.repeat(reps, reps)
            within = (np.arange(n) - first + 0.5) * (60.0 / per)
        times.append(m * 60.0 + within)
        funcs.append(np.repeat(nz, reps))
    if not times:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    return np.concatenate(times), np.concatenate(funcs)


def azure_functions(
    path: Path, name: str, *, spread: str = "uniform", seed: int = 0, triggers: Sequence[str] | None = None
) -> Imported:
    """Every invocation of every function (of ``triggers`` only, when given) as one request."""
    header = csv_header(path)
    minutes = [str(m) for m in range(1, MINUTES + 1)]
    missing = [c for c in (*ID_COLUMNS, *minutes) if c not in header]
    if missing:
        raise TraceError(
            f"no column {missing[0]!r}: a {name} file has the header {','.join(ID_COLUMNS)},1,2,...,"
            f"{MINUTES} (invocations per minute of one day); found {','.join(header)[:200]}; "
            "is --format right?",
            path=str(path),
            line=1,
        )
    table = _read_counts(path, name, minutes)
    fail = failer(path, csv_locator(path))
    rows = np.arange(table.num_rows)
    if triggers:
        trig = np.asarray(table.column("Trigger").to_numpy(zero_copy_only=False), dtype=object)
        rows = np.flatnonzero(np.isin(trig, list(triggers)))
    counts = [whole_numbers(table.column(m), m, "invocations", fail)[rows] for m in minutes]
    total = int(sum(int(c.sum()) for c in counts))
    if total > MAX_ARRIVALS:
        raise TraceError(
            f"{total:,} invocations: more than {MAX_ARRIVALS:,} requests would not fit in memory; "
            "take part of the file (--trigger, or fewer rows)",
            path=str(path),
        )
    t, func = spread_minutes(counts, spread, np.random.default_rng(seed))
    first_minute = int(t.min() // 60) + 1 if t.shape[0] else 0
    take = pa.array(rows[func])
    # Dictionary-encoded before the take: one index per request, each hash stored once.
    extra = {
        kept: table.column(source).combine_chunks().dictionary_encode().take(take)
        for source, kept in (("HashApp", "app"), ("HashFunction", "function"), ("Trigger", "trigger"))
    }
    how = f"uniformly at random (seed {seed})" if spread == "uniform" else "evenly"
    which = f" with trigger {','.join(triggers)}" if triggers else ""
    note = (
        f"{name}: {rows.shape[0]:,} functions{which}, {total:,} invocations spread {how} within "
        f"their minutes, from minute {first_minute}; size 0 (the model's default); kept {', '.join(extra)}"
    )
    return sorted_import(t, np.zeros(t.shape[0], dtype=np.int64), extra, f"{name}:{path}", note)


def _read_counts(path: Path, name: str, minutes: list[str]) -> pa.Table:
    """The id columns as strings and the minutes as int64; a cell that is not a whole number makes
    the whole file re-read as strings, so that whole_numbers names its line and minute."""
    try:
        return read_csv_columns(path, name, (*ID_COLUMNS, *minutes), types=dict.fromkeys(minutes, pa.int64()))
    except TraceError:
        table = read_csv_columns(path, name, (*ID_COLUMNS, *minutes))
        fail = failer(path, csv_locator(path))
        first: tuple[int, int, TraceError] | None = None
        for k, m in enumerate(minutes):
            try:
                whole_numbers(table.column(m), m, "invocations", fail)
            except TraceError as exc:
                line = exc.line or 0
                if first is None or line < first[0]:
                    first = (line, k, exc)
        if first is not None:
            raise first[2] from None
        raise
