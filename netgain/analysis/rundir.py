"""Read a run directory into numpy arrays: only the columns the report needs, one column at a time.

Reading column by column (instead of one ``read_table``) keeps peak memory near one Arrow
column plus the numpy arrays we keep: 10 million rows stay well under the 4 GB budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from netgain.analysis import sample_arrays
from netgain.analysis.counters import add_ratios
from netgain.analysis.sample_arrays import SampleArrays
from netgain.contract import rundir as files
from netgain.contract.phases import PHASES
from netgain.contract.records import PHASE_COLUMNS, REQUIRED_COLUMNS
from netgain.errors import NetgainError

NS_PER_MS = 1e6


class AnalysisError(NetgainError):
    """A run directory (or a comparison) the report cannot use; the message says how to fix it."""


@dataclass
class Requests:
    """Per-request arrays, all of length ``n``; NaN marks a missing value (never sent, never answered)."""

    n: int
    scheduled_s: np.ndarray  # float64 seconds since the run epoch
    latency_ms: np.ndarray  # done - scheduled
    service_ms: np.ndarray  # done - sent
    send_lag_ms: np.ndarray  # sent - scheduled
    status_code: np.ndarray  # int index into status_names
    status_names: list[str]
    warmup: np.ndarray  # bool
    phases: dict[str, np.ndarray]  # queue..post in ms, NaN where the trailer was missing
    server_total_ms: np.ndarray
    batch_size: np.ndarray  # float64, NaN where unknown
    request_id: np.ndarray | None = None  # only loaded to join a span log
    join: dict[str, Any] = field(default_factory=dict)

    def status_mask(self, name: str) -> np.ndarray:
        if name not in self.status_names:
            return np.zeros(self.n, dtype=bool)
        return np.asarray(self.status_code == self.status_names.index(name))


def load_meta(run_dir: str | Path) -> dict[str, Any]:
    """``RUN_DIR/meta.json``, its schema version checked (``netgain.contract.rundir``)."""
    try:
        return files.read_meta(run_dir)
    except files.RunDirError as exc:
        raise AnalysisError(str(exc)) from None


def _damaged(path: Path, exc: BaseException) -> AnalysisError:
    """One line for a Parquet file Arrow cannot read (its messages span several lines)."""
    why = " ".join(str(exc).split()).rstrip(".")
    return AnalysisError(
        f"{path} is not a readable Parquet file ({why[:160]}): it is damaged; re-run `netgain load` "
        "with a new --out"
    )


def _open_parquet(path: Path) -> pq.ParquetFile:
    if not path.exists():
        raise AnalysisError(
            f"{path} is missing: re-run `netgain load` (it writes one row per scheduled request)"
        )
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise _damaged(path, exc) from None


def _column(pf: pq.ParquetFile, name: str) -> pa.Array:
    return pf.read(columns=[name]).column(0).combine_chunks()


def _float(arr: pa.Array) -> np.ndarray:
    """Arrow numeric column → float64 numpy with NaN for nulls."""
    return np.asarray(pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def _ns(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Nullable int64 ns column → (int64 values with 0 for nulls, valid mask)."""
    valid = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=bool)
    values = np.asarray(pc.fill_null(pc.cast(arr, pa.int64()), 0).to_numpy(), dtype=np.int64)
    return values, valid


def _diff_ms(a: np.ndarray, b: np.ndarray, valid: np.ndarray) -> np.ndarray:
    # Subtract in int64 first: ns since epoch are exact there; float only for the difference.
    out = (a - b).astype(np.float64) / NS_PER_MS
    out[~valid] = np.nan
    return out


def load_requests(run_dir: str | Path, *, warmup_s: float | None = None, with_ids: bool = False) -> Requests:
    path = Path(run_dir) / files.REQUESTS
    pf = _open_parquet(path)
    names = set(pf.schema_arrow.names)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise AnalysisError(
            f"{path} lacks column(s) {', '.join(missing)}: it was not written by this "
            "netgain version; re-run `netgain load`"
        )
    try:
        sched, _ = _ns(_column(pf, "scheduled_ns"))
        sent, sent_ok = _ns(_column(pf, "sent_ns"))
        send_lag = _diff_ms(sent, sched, sent_ok)
        done, done_ok = _ns(_column(pf, "done_ns"))
        latency = _diff_ms(done, sched, done_ok)
        service = _diff_ms(done, sent, done_ok & sent_ok)
        del sent, done
        scheduled_s = sched.astype(np.float64) / 1e9
        del sched
        status = pc.dictionary_encode(pc.fill_null(_column(pf, "status"), "UNKNOWN"))
        codes = np.asarray(status.indices.to_numpy(zero_copy_only=False), dtype=np.int32)
        status_names = [str(s) for s in status.dictionary.to_pylist()]
        del status
        if warmup_s is not None:
            warm = scheduled_s < warmup_s
        else:
            warm = np.asarray(
                pc.fill_null(_column(pf, "warmup"), False).to_numpy(zero_copy_only=False), dtype=bool
            )
        nan = np.full(len(scheduled_s), np.nan)
        phases = {
            p: _float(_column(pf, c)) if c in names else nan.copy()
            for p, c in zip(PHASES, PHASE_COLUMNS, strict=True)
        }
        total = _float(_column(pf, "server_total_ms")) if "server_total_ms" in names else nan.copy()
        batch = _float(_column(pf, "batch_size")) if "batch_size" in names else nan.copy()
        ids = None
        if with_ids and "request_id" in names:
            ids = np.asarray(_column(pf, "request_id").to_numpy(zero_copy_only=False))
    except (pa.ArrowException, OSError) as exc:
        raise _damaged(path, exc) from None
    return Requests(
        n=len(scheduled_s),
        scheduled_s=scheduled_s,
        latency_ms=latency,
        service_ms=service,
        send_lag_ms=send_lag,
        status_code=codes,
        status_names=status_names,
        warmup=warm,
        phases=phases,
        server_total_ms=total,
        batch_size=batch,
        request_id=ids,
    )


def load_samples(run_dir: str | Path) -> SampleArrays | None:
    """samples.parquet as numpy arrays, read a batch at a time (memory: 20 bytes a row, not the
    strings), or None when the run has none (the report then says so in its warnings).

    The scraped counters (CPU and kernel seconds) come with the ratio series derived from them
    (``counters.add_ratios``), which the report's ``cpu`` and ``gpu`` sections read."""
    path = Path(run_dir) / files.SAMPLES
    if not path.exists():
        return None
    pf = _open_parquet(path)
    try:
        arrays = sample_arrays.read(pf)
    except (pa.ArrowException, KeyError, OSError, ValueError) as exc:
        raise _damaged(path, exc) from None
    return add_ratios(arrays)


# the span log's phase fields, named as the request records' columns
SPAN_FIELDS = dict(zip(PHASE_COLUMNS, PHASES, strict=True))


def _unfinished_tail(path: Path, size: int) -> int:
    """The bytes after the span log's last newline (``size`` bytes long) when they are a line a
    server has begun to write (``{`` but not yet JSON), else 0: it may be appending it right now."""
    tail = b""
    with path.open("rb") as f:
        while len(tail) < size:
            step = min(size - len(tail), max(4096, len(tail)))
            f.seek(size - len(tail) - step)
            tail = f.read(step) + tail
            if b"\n" in tail:
                break
    tail = tail[tail.rfind(b"\n") + 1 :]
    if not tail.lstrip().startswith(b"{"):
        return 0
    try:
        json.loads(tail)
    except ValueError:
        return len(tail)
    return 0


def _read_span_lines(path: Path) -> pa.Table:
    """The span log's lines, less one a running server is still writing; read in blocks (a
    whole log as pyarrow reads it, a cut one through a memory map), never copied whole."""
    import pyarrow.json as pj

    size = path.stat().st_size
    cut = size - _unfinished_tail(path, size)
    if cut == size and size:
        spans = pj.read_json(path)
    elif cut:
        spans = pj.read_json(pa.BufferReader(pa.memory_map(str(path)).read_buffer(cut)))
    else:
        spans = pa.table({})
    return spans if spans.num_rows else pa.table({"id": pa.array([], pa.string())})


def join_span_log(req: Requests, span_log: str | Path) -> dict[str, Any]:
    """Fill missing server phases from the span log, matched by request id; count every unmatched row.

    Trailer values win where both exist (they came with the very response the client timed);
    the span log fills rows whose trailer was lost (deadline exceeded, transport errors).
    """
    path = Path(span_log)
    if not path.exists():
        raise AnalysisError(f"span log {str(path)!r} does not exist: pass the server's --span-log file")
    if req.request_id is None:
        raise AnalysisError("requests.parquet has no request_id column, so the span log cannot be joined")
    try:
        spans = _read_span_lines(path)
    except pa.ArrowException as exc:
        raise AnalysisError(
            f"span log {str(path)!r} is not JSON lines ({exc}): pass the server's span log"
        ) from None
    if "id" not in spans.column_names:
        raise AnalysisError(f"span log {str(path)!r} has no 'id' field: pass the server's span log")
    span_ids = pc.cast(spans.column("id"), pa.string()).combine_chunks()
    # index of each span in the client's rows; null where the client never scheduled that id
    where = pc.index_in(span_ids, value_set=pa.array(req.request_id, pa.string()))
    matched = np.asarray(pc.is_valid(where).to_numpy(zero_copy_only=False), dtype=bool)
    rows = np.asarray(pc.fill_null(where, 0).to_numpy(), dtype=np.int64)[matched]
    unique_rows = np.unique(rows)
    hit = np.zeros(req.n, dtype=bool)
    hit[unique_rows] = True
    sent = ~np.isnan(req.send_lag_ms)
    filled = 0
    for key, phase in [*SPAN_FIELDS.items(), ("total_ms", "total"), ("batch_size", "batch")]:
        if key not in spans.column_names:
            continue
        vals = _float(spans.column(key).combine_chunks())[matched]
        if phase == "total":
            target = req.server_total_ms
        elif phase == "batch":
            target = req.batch_size
        else:
            target = req.phases[phase]
        gap = np.isnan(target[rows]) & ~np.isnan(vals)
        if gap.any():
            if not target.flags.writeable:  # zero-copy view of an Arrow buffer
                target = target.copy()
            target[rows[gap]] = vals[gap]
            if phase == "total":
                req.server_total_ms = target
            elif phase == "batch":
                req.batch_size = target
            else:
                req.phases[phase] = target
        if phase == "total":
            filled = int(gap.sum())
    join = {
        "span_log": str(path),
        "spans": len(span_ids),
        "matched_spans": int(matched.sum()),
        "unmatched_spans": int((~matched).sum()),  # server saw it, client has no such row
        "duplicate_spans": int(len(rows) - len(unique_rows)),
        "unmatched_requests": int((sent & ~hit).sum()),  # client sent it, server logged no span
        "filled_from_span_log": filled,
    }
    req.join = join
    return join
