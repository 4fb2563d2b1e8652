"""Trace files: CSV, JSON lines and Parquet with columns ``t`` (or ``t_s``), ``size``, ``items``.

Reading is vectorised (pyarrow); only when something is wrong does a slow pass run to
name the exact line. Rows must already be ordered by ``t``: an out-of-order row is an
error (``netgain trace import`` sorts raw logs; a trace file is the schedule as given).
"""

from __future__ import annotations

import csv
import json
import os
import shlex
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from netgain.loadgen.traces.model import Trace, TraceError

TIME_NAMES = ("t", "t_s")
FIELDS = ("size", "items")
CSV_EXT = (".csv",)
JSONL_EXT = (".jsonl", ".ndjson")
PARQUET_EXT = (".parquet", ".pq")

# Data row index (0-based) -> (line or row number, unit) for error messages.
Locator = Callable[[int], tuple[int, str]]


def num(x: float) -> str:
    """A number for a message: 5 not 5.0, full precision otherwise."""
    f = float(x)
    return str(int(f)) if f.is_integer() and abs(f) < 2**53 else repr(f)


def trace_format(path: str | os.PathLike[str]) -> str:
    ext = Path(path).suffix.lower()
    if ext in CSV_EXT:
        return "csv"
    if ext in JSONL_EXT:
        return "jsonl"
    if ext in PARQUET_EXT:
        return "parquet"
    raise TraceError(
        f"unknown trace format {ext or '(no extension)'!r}: use .csv, .jsonl/.ndjson or .parquet",
        path=str(path),
    )


# ---------------------------------------------------------------------------------------- reading


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file (format by extension). Raises TraceError naming file, line and field."""
    p = Path(path)
    fmt = trace_format(p)
    if not p.is_file():
        raise FileNotFoundError(f"trace file {str(p)!r} does not exist")
    names = _all_columns(p, fmt)
    if names is not None:  # the readers keep only t/size/items: judge the others here
        header = 1 if fmt == "csv" else None
        _pick_time(names, str(p), header)
        _unknown_columns(names, str(p), header)
    if fmt == "csv":
        table, locate = _read_csv(p)
    elif fmt == "jsonl":
        table, locate = _read_jsonl(p)
    else:
        table, locate = _read_parquet(p)
    return table_to_trace(table, str(p), locate, source=f"file:{p}", header_line=1 if fmt == "csv" else None)


def _all_columns(p: Path, fmt: str) -> list[str] | None:
    """Every column name of the file (None where it cannot be told cheaply: the reader will say)."""
    try:
        if fmt == "csv":
            return csv_header(p)
        if fmt == "parquet":
            return list(pq.read_schema(p).names)
        with p.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    first = json.loads(line)
                    return [str(k) for k in first] if isinstance(first, dict) else None
    except (OSError, ValueError, pa.ArrowException):
        return None
    return None


SIZE_HINTS = ("size", "bytes", "length", "len")
TIME_HINTS = ("time", "timestamp", "ts", "t_ms", "ms", "sec", "secs", "seconds", "date", "arrival", "at")


def _looks_like(name: str, hints: tuple[str, ...]) -> bool:
    words = [w for w in name.lower().replace(".", "_").replace("-", "_").split("_") if w]
    return any(w in hints for w in words) or any(h in name.lower() for h in hints if len(h) > 3)


def _unknown_columns(names: list[str], path: str, header_line: int | None) -> None:
    """A column that looks like sizes (``size_bytes``, ``request_bytes``) in a trace without
    ``size`` would otherwise be ignored silently, every request taking the default size."""
    if "size" in names:
        return
    sizes = [
        n
        for n in names
        if n not in (*TIME_NAMES, *FIELDS)
        and _looks_like(n, SIZE_HINTS)
        and not any(w in n.lower() for w in ("batch", "item"))  # items per request, not bytes
    ]
    if sizes:
        raise TraceError(
            f"column {sizes[0]!r} looks like payload sizes, but a trace's size column is 'size' "
            f"(found {names}): rename it to 'size', or make the trace with `netgain trace import "
            f"{shlex.quote(path)} --time-column T --size-column {sizes[0]} --out FILE`",
            path=path,
            line=header_line,
        )


def _pick_time(names: list[str], path: str, header_line: int | None) -> str:
    present = [n for n in TIME_NAMES if n in names]
    if not present:
        times = [n for n in names if _looks_like(n, TIME_HINTS)]
        hint = (
            f": is {times[0]!r} the arrival time? `netgain trace import {shlex.quote(path)} "
            f"--time-column {times[0]} [--size-column C] --out FILE` converts it"
            if times
            else "; `netgain trace import` converts an access log"
        )
        raise TraceError(
            f"no arrival time column: expected 't' (or 't_s', seconds); found {names}{hint}",
            path=path,
            line=header_line,
        )
    if len(present) > 1:
        raise TraceError("both 't' and 't_s' columns present; keep one", path=path, line=header_line)
    return present[0]


def table_to_trace(
    table: pa.Table, path: str, locate: Locator, *, source: str, header_line: int | None = None
) -> Trace:
    """Validate columns t|t_s, size, items of ``table`` and build a Trace (errors located via ``locate``)."""
    tname = _pick_time(table.column_names, path, header_line)
    _unknown_columns(table.column_names, path, header_line)
    n = table.num_rows

    def fail(i: int, field: str, msg: str) -> TraceError:
        line, unit = locate(i)
        return TraceError(msg, path=path, line=line, field=field, unit=unit)

    t = column_floats(table.column(tname), tname, fail)
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise fail(i, tname, f"arrival time {num(t[i])} must be a finite number of seconds >= 0")
    if n > 1:
        dec = np.diff(t) < 0
        if dec.any():
            i = int(np.argmax(dec)) + 1
            raise fail(
                i,
                tname,
                f"arrival time {num(t[i])} is earlier than the previous row's {num(t[i - 1])}; "
                "rows must be ordered by t (sort the file, or use `netgain trace import`, which sorts)",
            )
    size = (
        whole_numbers(table.column("size"), "size", "size", fail)
        if "size" in table.column_names
        else np.zeros(n, dtype=np.int64)
    )
    items = (
        whole_numbers(table.column("items"), "items", "items", fail)
        if "items" in table.column_names
        else np.ones(n, dtype=np.int64)
    )
    return Trace(t, size, items, source=source)


# kind -> (lowest, highest, unit in messages) of a column of whole numbers.
WHOLE_KINDS = {
    "size": (0, 2.0**62, "bytes"),
    "items": (1, float(np.iinfo(np.int32).max), "items per request"),
    "tokens": (0, 2.0**53, "tokens"),
    "invocations": (0, 2.0**53, "invocations"),
}


def whole_numbers(
    col: pa.ChunkedArray | pa.Array, field: str, kind: str, fail: Callable[[int, str, str], TraceError]
) -> np.ndarray:
    """A column of whole numbers as int64: ``kind`` "size" (bytes >= 0), "items" (>= 1), "tokens"
    or "invocations" (>= 0); the first bad value raises via ``fail``."""
    v = column_floats(col, field, fail)
    lo, hi, unit = WHOLE_KINDS[kind]
    bad = ~np.isfinite(v) | (v < lo) | (v > hi) | (v != np.floor(v))
    if bad.any():
        i = int(np.argmax(bad))
        raise fail(i, field, f"{num(v[i])} is not valid: need a whole number of {unit} >= {num(lo)}")
    return v.astype(np.int64)


def column_floats(
    col: pa.ChunkedArray | pa.Array, field: str, fail: Callable[[int, str, str], TraceError]
) -> np.ndarray:
    """A column as float64, strings parsed; the first unparsable or missing value raises via ``fail``."""
    typ = col.type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        trimmed = pc.utf8_trim_whitespace(col)
        try:
            arr = pc.cast(trimmed, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            for i, raw in enumerate(trimmed.to_pylist()):
                if raw is None:
                    continue
                try:
                    float(raw)
                except ValueError:
                    if raw == "":
                        raise fail(i, field, "empty value; a number is required") from None
                    raise fail(i, field, f"{raw!r} is not a number") from None
            raise
    elif pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        arr = pc.cast(col, pa.float64())
    elif pa.types.is_null(typ):
        raise fail(0, field, "missing value; a number is required")
    else:
        raise fail(0, field, f"expected numbers, got column type {typ}")
    if arr.null_count:
        i = int(np.argmax(np.asarray(pc.is_null(arr).to_numpy(zero_copy_only=False))))
        raise fail(i, field, "missing value; a number is required")
    out = arr.to_numpy(zero_copy_only=False)
    return np.asarray(out, dtype=np.float64)


def csv_header(p: Path, delimiter: str = ",") -> list[str]:
    with p.open(newline="", encoding="utf-8-sig") as f:
        for row in csv.reader(f, delimiter=delimiter):
            if row:
                return [c.strip() for c in row]
    raise TraceError("the file is empty; expected a header line such as 't,size,items'", path=str(p), line=1)


def csv_locator(p: Path, delimiter: str = ",") -> Locator:
    """Data row index -> 1-based line (header = line 1), skipping blank lines as the reader does."""

    def locate(i: int) -> tuple[int, str]:
        with p.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, delimiter=delimiter)
            k = -1  # the header is record -1
            for row in reader:
                if not row:
                    continue
                if k == i:
                    return reader.line_num, "line"
                k += 1
        return i + 2, "line"

    return locate


def _read_csv(p: Path) -> tuple[pa.Table, Locator]:
    names = csv_header(p)
    wanted = [n for n in (*TIME_NAMES, *FIELDS) if n in names]
    try:
        table = pacsv.read_csv(
            p,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=1 << 24),
            convert_options=pacsv.ConvertOptions(
                include_columns=wanted,
                column_types=dict.fromkeys(wanted, pa.string()),
                strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise TraceError(f"not a readable CSV file: {exc}", path=str(p)) from None
    return table, csv_locator(p)


def jsonl_locator(p: Path) -> Locator:
    def locate(i: int) -> tuple[int, str]:
        k = -1
        with p.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    k += 1
                    if k == i:
                        return lineno, "line"
        return i + 1, "line"

    return locate


def _read_jsonl(p: Path) -> tuple[pa.Table, Locator]:
    locate = jsonl_locator(p)
    try:
        table = pajson.read_json(p, read_options=pajson.ReadOptions(block_size=1 << 24))
    except pa.ArrowInvalid:
        table = _read_jsonl_slow(p)
    keep = [n for n in (*TIME_NAMES, *FIELDS) if n in table.column_names]
    table = table.select(keep)
    # An object without "size" or "items" (or with null) takes the default, as a missing column would.
    for name, default in (("size", 0), ("items", 1)):
        if name in table.column_names:
            col = table.column(name)
            i = table.column_names.index(name)
            if pa.types.is_null(col.type):
                table = table.remove_column(i)
            elif col.null_count:
                fill = str(default) if pa.types.is_string(col.type) else pa.scalar(default).cast(col.type)
                table = table.set_column(i, name, col.fill_null(fill))
    return table, locate


def jsonl_objects(p: Path, example: str = "") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; TraceError naming the first line that is not
    a JSON object (``example`` shows one in the message)."""
    want = f"expected a JSON object per line{', e.g. ' + example if example else ''}"
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line.rstrip("\r\n"))  # a column past the end, not "column 1"
            except json.JSONDecodeError as exc:
                raise TraceError(
                    f"not valid JSON: {exc.msg} (column {exc.colno})", path=str(p), line=lineno
                ) from None
            if not isinstance(rec, dict):
                raise TraceError(want, path=str(p), line=lineno)
            yield lineno, rec


def _read_jsonl_slow(p: Path) -> pa.Table:
    """Line-by-line parse, for files pyarrow refuses: names the first bad line."""
    cols: dict[str, list[Any]] = {n: [] for n in (*TIME_NAMES, *FIELDS)}
    seen: set[str] = set()
    for lineno, rec in jsonl_objects(p, '{"t": 0.5, "size": 1024}'):
        for name, values in cols.items():
            v = rec.get(name)
            if name in rec:
                seen.add(name)
            if isinstance(v, bool) or not (v is None or isinstance(v, int | float | str)):
                raise TraceError(f"{v!r} is not a number", path=str(p), line=lineno, field=name)
            values.append(None if v is None else str(v))
    return pa.table({n: pa.array(v, type=pa.string()) for n, v in cols.items() if n in seen})


def _read_parquet(p: Path) -> tuple[pa.Table, Locator]:
    try:
        names = pq.read_schema(p).names
        table = pq.read_table(p, columns=[n for n in (*TIME_NAMES, *FIELDS) if n in names])
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceError(f"not a readable Parquet file: {exc}", path=str(p)) from None
    return table, lambda i: (i + 1, "row")


# ---------------------------------------------------------------------------------------- writing


def _extra_columns(trace: Trace, extra: Mapping[str, pa.Array] | None) -> dict[str, pa.Array]:
    """Columns written beside t/size/items (readers ignore them): one value per request."""
    out: dict[str, pa.Array] = {}
    for name, col in (extra or {}).items():
        if name in (*TIME_NAMES, *FIELDS):
            raise ValueError(f"extra column {name!r} would shadow a trace column")
        if len(col) != len(trace):
            raise ValueError(f"extra column {name!r} has {len(col)} values for {len(trace)} requests")
        out[name] = col
    return out


def _csv_cell(col: pa.Array) -> pa.Array:
    """A column CSV can hold: lists become space-separated values."""
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        return pc.binary_join(pc.cast(col, pa.list_(pa.string())), " ")
    return col


def write_trace(
    trace: Trace, path: str | os.PathLike[str], extra: Mapping[str, pa.Array] | None = None
) -> None:
    """Write ``trace`` as CSV, JSON lines or Parquet (by extension), atomically.

    ``extra``: more columns, in trace order, written after ``t, size, items`` (what an imported
    trace kept of its source, such as token counts); readers ignore them and the digest leaves
    them out. In CSV a list value is written as its items separated by spaces.
    """
    p = Path(path)
    fmt = trace_format(p)
    more = _extra_columns(trace, extra)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    table = pa.table(
        {
            "t": pa.array(trace.t_s, type=pa.float64()),
            "size": pa.array(trace.size, type=pa.int64()),
            "items": pa.array(trace.items, type=pa.int32()),
            **more,
        }
    )
    try:
        if fmt == "csv":
            with tmp.open("wb") as f:
                f.write((",".join(table.column_names) + "\n").encode())
                if more:  # strings may hold commas: quoted
                    table = pa.table({n: _csv_cell(table.column(n)) for n in table.column_names})
                quoting = "needed" if more else "none"
                pacsv.write_csv(table, f, pacsv.WriteOptions(include_header=False, quoting_style=quoting))
        elif fmt == "jsonl":
            with tmp.open("w", encoding="utf-8") as f:
                rows = zip(trace.t_s.tolist(), trace.size.tolist(), trace.items.tolist(), strict=True)
                if not more:
                    f.writelines(f'{{"t":{t!r},"size":{s},"items":{i}}}\n' for t, s, i in rows)
                else:
                    cells = [[f',"{n}":{json.dumps(v)}' for v in c.to_pylist()] for n, c in more.items()]
                    f.writelines(
                        f'{{"t":{t!r},"size":{s},"items":{i}{"".join(c[k] for c in cells)}}}\n'
                        for k, (t, s, i) in enumerate(rows)
                    )
        else:
            table = table.replace_schema_metadata(
                {"netgain.source": trace.source, "netgain.digest": trace.digest()}
            )
            pq.write_table(table, tmp)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
