"""Records → requests.parquet, written incrementally; at the end every scheduled request has a row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.runner.protocol import PHASE_COLUMNS, RECORD_COLUMNS

SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("request_id", pa.string()),
        ("worker", pa.int32()),
        ("target", pa.string()),
        ("warmup", pa.bool_()),
        ("scheduled_ns", pa.int64()),
        ("sent_ns", pa.int64()),
        ("done_ns", pa.int64()),
        ("status", pa.string()),
        ("items", pa.int32()),
        ("request_bytes", pa.int64()),
        ("response_bytes", pa.int64()),
        ("batch_id", pa.int64()),
        ("batch_size", pa.int32()),
        *[(c, pa.float64()) for c in PHASE_COLUMNS],
        ("server_total_ms", pa.float64()),
    ]
)
assert tuple(SCHEMA.names) == RECORD_COLUMNS


class RecordSink:
    """Turns each message of records into an Arrow record batch at once and writes a row group
    every ``flush_rows`` rows.

    Memory stays bounded by ``flush_rows`` rows (in Arrow buffers, not Python objects) plus one
    flag byte per scheduled request (to know which requests have a row), so hour-long soaks do
    not grow the master. Holding a row group as Python lists (a million objects at 50,000 rows)
    fragmented the master's heap: its RSS crept up ~20 MB/h in hour-long soaks.
    """

    def __init__(self, path: str, scheduled: int, flush_rows: int = 50_000) -> None:
        self.path = path
        self.flush_rows = flush_rows
        self._writer = pq.ParquetWriter(path, SCHEMA, compression="zstd")
        self._batches: list[pa.RecordBatch] = []
        self._rows = 0
        self.seen = np.zeros(scheduled, dtype=bool)
        self.extra_rows = 0  # closed-loop requests beyond the schedule
        self.duplicates = 0
        self.written = 0

    def add(self, cols: dict[str, list[Any]]) -> None:
        idx = cols["index"]
        for i in idx:
            if 0 <= i < self.seen.shape[0]:
                if self.seen[i]:
                    self.duplicates += 1
                self.seen[i] = True
            else:
                self.extra_rows += 1
        self._append(cols)
        if self._rows >= self.flush_rows:
            self.flush()

    def _append(self, cols: dict[str, list[Any]]) -> None:
        if not cols["index"]:
            return
        self._batches.append(
            pa.RecordBatch.from_arrays(
                [pa.array(cols[c], type=SCHEMA.field(c).type) for c in RECORD_COLUMNS], schema=SCHEMA
            )
        )
        self._rows += len(cols["index"])

    def flush(self) -> None:
        if not self._rows:
            return
        self._writer.write_table(pa.Table.from_batches(self._batches, schema=SCHEMA))
        self.written += self._rows
        self._batches = []
        self._rows = 0
        # Hand the arrays' freed pages back: Arrow's allocator otherwise keeps what each row group
        # grew it to.
        pa.default_memory_pool().release_unused()

    def missing(self) -> np.ndarray:
        return np.flatnonzero(~self.seen)

    def close(self, fill: dict[str, list[Any]] | None = None) -> None:
        """Write the rows for requests that never reported (``fill``), then close the file."""
        if fill:
            self._append(fill)
        self.flush()
        self._writer.close()
