"""Turn a server or proxy access log (CSV/TSV or JSON lines) into a trace.

Timestamps may be epoch seconds, milliseconds, microseconds or nanoseconds (``auto`` picks
by magnitude), ISO-8601 strings (with or without a zone offset; without one they are read
as UTC), or any ``strptime`` pattern. Rows are sorted by time (logs are often written out of
order by concurrent workers) and offsets start at the first request. A size of ``-`` or an
empty size counts as 0 (the model's default size); an empty items value counts as 1.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from netgain.loadgen.traces.io import (
    Locator,
    column_floats,
    csv_header,
    csv_locator,
    jsonl_locator,
    num,
    whole_numbers,
)
from netgain.loadgen.traces.model import Trace, TraceError

TIME_FORMATS = ("auto", "s", "ms", "us", "ns", "iso")
_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
Fail = Callable[[int, str, str], TraceError]


def _log_kind(p: Path) -> tuple[str, str]:
    ext = p.suffix.lower()
    if ext in (".jsonl", ".ndjson", ".json"):
        return "jsonl", ""
    if ext == ".tsv":
        return "csv", "\t"
    if ext == ".csv":
        return "csv", ","
    with p.open(encoding="utf-8-sig", errors="replace") as f:
        for line in f:
            if line.strip():
                return (
                    ("jsonl", "") if line.lstrip().startswith("{") else ("csv", "\t" if "\t" in line else ",")
                )
    raise TraceError("the log is empty", path=str(p))


def _read_csv_log(p: Path, delimiter: str, columns: list[str]) -> pa.Table:
    names = csv_header(p, delimiter)
    missing = [c for c in columns if c not in names]
    if missing:
        raise TraceError(f"no column {missing[0]!r} in the header; columns are {names}", path=str(p), line=1)
    try:
        return pacsv.read_csv(
            p,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=1 << 24),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(
                include_columns=columns,
                column_types=dict.fromkeys(columns, pa.string()),
                strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise TraceError(f"not a readable CSV log: {exc}", path=str(p)) from None


def _lookup(rec: dict[str, Any], name: str) -> Any:
    if name in rec:
        return rec[name]
    cur: Any = rec
    for part in name.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _read_jsonl_log(p: Path, columns: list[str]) -> pa.Table:
    try:
        table = pajson.read_json(p, read_options=pajson.ReadOptions(block_size=1 << 24))
        while any(pa.types.is_struct(f.type) for f in table.schema):
            table = table.flatten()
        if all(c in table.column_names for c in columns):
            return table.select(columns)
    except pa.ArrowInvalid:
        pass
    # Slow path: mixed types, bad lines, or a missing column to report precisely.
    values: dict[str, list[str | None]] = {c: [] for c in columns}
    seen: set[str] = set()
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"not valid JSON: {exc.msg}", path=str(p), line=lineno) from None
            if not isinstance(rec, dict):
                raise TraceError("expected a JSON object per line", path=str(p), line=lineno)
            for c in columns:
                v = _lookup(rec, c)
                if v is not None:
                    seen.add(c)
                values[c].append(None if v is None else str(v))
    missing = [c for c in columns if c not in seen]
    if missing:
        raise TraceError(f"no record has a field {missing[0]!r} (nested fields as 'a.b')", path=str(p))
    return pa.table({c: pa.array(v, type=pa.string()) for c, v in values.items()})


def _iso_ns(col: pa.ChunkedArray, field: str, fail: Fail, hint: str = "; set --time-format") -> np.ndarray:
    for typ in (pa.timestamp("ns", tz="UTC"), pa.timestamp("ns")):
        try:
            return np.asarray(
                pc.cast(pc.cast(col, typ), pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    out = np.empty(len(col), dtype=np.int64)
    for i, raw in enumerate(col.to_pylist()):
        try:
            ts = datetime.fromisoformat(str(raw).strip().replace("Z", "+00:00"))
        except ValueError:
            raise fail(
                i,
                field,
                f"{raw!r} is not an ISO-8601 time (e.g. 2024-05-01T12:00:00.250Z){hint}",
            ) from None
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=UTC)
        delta = ts - datetime(1970, 1, 1, tzinfo=UTC)
        out[i] = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
    return out


def times_s(
    col: pa.ChunkedArray, field: str, time_format: str, fail: Fail, hint: str = "; set --time-format"
) -> np.ndarray:
    """Seconds relative to the earliest time (precision kept by subtracting in integer ns);
    ``hint`` ends the message of a time that is not ISO-8601."""
    if col.null_count:
        i = int(np.argmax(np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False))))
        raise fail(i, field, "missing timestamp")
    if time_format not in TIME_FORMATS and "%" not in time_format:
        raise ValueError(f"time format {time_format!r}: use {', '.join(TIME_FORMATS)} or a strptime pattern")
    is_str = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
    if is_str:
        col = pc.utf8_trim_whitespace(col)
        if time_format == "auto" and len(col):
            try:
                float(col[0].as_py())  # the first value decides: a number means epoch time
            except ValueError:
                time_format = "iso"
    if "%" in time_format:
        parsed = pc.strptime(col, format=time_format, unit="ns", error_is_null=True)
        if parsed.null_count:
            i = int(np.argmax(np.asarray(pc.is_null(parsed).to_numpy(zero_copy_only=False))))
            raise fail(i, field, f"{col[i].as_py()!r} does not match the time format {time_format!r}")
        ns = np.asarray(pc.cast(parsed, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
        return (ns - ns.min()).astype(np.float64) / 1e9
    if time_format == "iso":
        ns = _iso_ns(col, field, fail, hint)
        return (ns - ns.min()).astype(np.float64) / 1e9
    ints: np.ndarray | None = None
    with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ints = np.asarray(pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    if ints is None:
        try:
            floats = np.asarray(pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            floats = column_floats(col, field, fail)  # raises, naming the row
        bad = ~np.isfinite(floats)
        if bad.any():
            raise fail(int(np.argmax(bad)), field, f"{num(floats[int(np.argmax(bad))])} is not a finite time")
        ref = float(np.median(np.abs(floats))) if floats.shape[0] else 0.0
    else:
        ref = float(np.median(np.abs(ints))) if ints.shape[0] else 0.0
    unit = time_format
    if unit == "auto":
        unit = "ns" if ref > 1e17 else "us" if ref > 1e14 else "ms" if ref > 1e11 else "s"
    per_ns = _UNIT_NS[unit]
    if ints is not None:
        return (ints - ints.min()).astype(np.float64) * per_ns / 1e9  # 5999 ms -> 5.999, exactly
    return (floats - floats.min()) * per_ns / 1e9


def _defaulted(col: pa.ChunkedArray, default: str) -> pa.ChunkedArray:
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.utf8_trim_whitespace(col)
        col = pc.if_else(pc.is_in(col, value_set=pa.array(["", "-"])), default, col)
    return col.fill_null(pa.scalar(default).cast(col.type) if col.type != pa.null() else default)


def import_access_log(
    path: str | os.PathLike[str],
    *,
    time_column: str,
    size_column: str | None = None,
    items_column: str | None = None,
    time_format: str = "auto",
) -> Trace:
    """A trace from an access log: arrival times from ``time_column``, optional size and items columns.

    Raises TraceError naming the file, line (header = line 1 for CSV) and column of a bad value.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"access log {str(p)!r} does not exist")
    kind, delimiter = _log_kind(p)
    columns = list(dict.fromkeys(c for c in (time_column, size_column, items_column) if c))
    locate: Locator
    if kind == "csv":
        table = _read_csv_log(p, delimiter, columns)
        locate = csv_locator(p, delimiter)
    else:
        table = _read_jsonl_log(p, columns)
        locate = jsonl_locator(p)

    def fail(i: int, field: str, msg: str) -> TraceError:
        line, unit = locate(i)
        return TraceError(msg, path=str(p), line=line, field=field, unit=unit)

    n = table.num_rows
    if n == 0:
        return Trace(np.zeros(0), np.zeros(0), np.zeros(0), source=f"access-log:{p} time={time_column}")
    t = times_s(table.column(time_column), time_column, time_format, fail)
    size = (
        whole_numbers(_defaulted(table.column(size_column), "0"), size_column, "size", fail)
        if size_column
        else np.zeros(n, dtype=np.int64)
    )
    items = (
        whole_numbers(_defaulted(table.column(items_column), "1"), items_column, "items", fail)
        if items_column
        else np.ones(n, dtype=np.int64)
    )
    order = np.argsort(t, kind="stable")
    return Trace(t[order], size[order], items[order], source=f"access-log:{p} time={time_column}")
