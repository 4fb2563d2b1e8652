"""What the public-trace readers share: the result, CSV columns by name, tokens to bytes, the sort."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from netgain.loadgen.traces.io import Locator, csv_header
from netgain.loadgen.traces.model import Trace, TraceError

#: Bytes per token when a token count becomes a payload size: about what a BPE tokenizer's token
#: averages in English text (4 characters), so a prompt's size is near its UTF-8 text's.
BYTES_PER_TOKEN = 4.0

Fail = Callable[[int, str, str], TraceError]


@dataclass(frozen=True)
class Imported:
    """A public trace as netgain replays it: the trace, the source columns kept beside it (in trace
    order, written after ``t, size, items``), and one line saying how rows became requests."""

    trace: Trace
    extra: dict[str, pa.Array] = field(default_factory=dict)
    note: str = ""


def failer(path: Path, locate: Locator) -> Fail:
    """``fail(row, field, message)``: a TraceError naming the file, the row's line and the field."""

    def fail(i: int, name: str, msg: str) -> TraceError:
        line, unit = locate(i)
        return TraceError(msg, path=str(path), line=line, field=name, unit=unit)

    return fail


def read_csv_columns(
    path: Path,
    what: str,
    required: tuple[str, ...],
    optional: tuple[str, ...] = (),
    types: dict[str, pa.DataType] | None = None,
) -> pa.Table:
    """The ``required`` and present ``optional`` columns of a CSV file with a header, as strings
    unless ``types`` says otherwise. A missing required column is an error at the header line
    naming the columns ``what`` (a format's name) needs."""
    names = csv_header(path)
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(
            f"no column {missing[0]!r}: a {what} file has the header {','.join(required)} "
            f"(found {','.join(names)[:200]}); is --format right?",
            path=str(path),
            line=1,
        )
    wanted = [*required, *(c for c in optional if c in names)]
    column_types = dict.fromkeys(wanted, pa.string())
    column_types.update(types or {})
    try:
        return pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=1 << 24),
            convert_options=pacsv.ConvertOptions(
                include_columns=wanted, column_types=column_types, strings_can_be_null=False
            ),
        )
    except pa.ArrowInvalid as exc:
        raise TraceError(f"not a readable {what} CSV file: {exc}", path=str(path)) from None


def token_bytes(tokens: np.ndarray, bytes_per_token: float) -> np.ndarray:
    """Payload bytes for token counts: ``round(tokens * bytes_per_token)``, at least 1 (a size of 0
    would mean the model's default size); all 0 (the default) when ``bytes_per_token`` is 0."""
    if not np.isfinite(bytes_per_token) or bytes_per_token < 0:
        raise ValueError(f"bytes per token {bytes_per_token!r} must be a finite number >= 0")
    if bytes_per_token == 0:
        return np.zeros(tokens.shape[0], dtype=np.int64)
    return np.maximum(np.rint(tokens * bytes_per_token), 1).astype(np.int64)


def sorted_import(
    t: np.ndarray, size: np.ndarray, extra: dict[str, pa.Array], source: str, note: str
) -> Imported:
    """Rows ordered by time (stable: ties keep file order), offsets from the first; ``extra`` follows."""
    order = np.argsort(t, kind="stable")
    t = t[order]
    if t.shape[0]:
        t = t - t[0]
    take = pa.array(order)
    kept = {name: col.take(take) for name, col in extra.items()}
    trace = Trace(t, size[order], np.ones(t.shape[0], dtype=np.int32), source=source)
    return Imported(trace, kept, note)
