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
    """Buffers columnar record batches and writes a row group every ``flush_rows`` rows.

    Memory stays bounded by ``flush_rows`` plus one flag byte per scheduled request
    (to know which requests have a row), so hour-long soaks do not grow the master.
    """

    def __init__(self, path: str, scheduled: int, flush_rows: int = 50_000) -> None:
        self.path = path
        self.flush_rows = flush_rows
        self._writer = pq.ParquetWriter(path, SCHEMA, compression="zstd")
        self._buf: dict[str, list[Any]] = {c: [] for c in RECORD_COLUMNS}
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
        for c in RECORD_COLUMNS:
            self._buf[c].extend(cols[c])
        self._rows += len(idx)
        if self._rows >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        table = pa.table(
            {c: pa.array(self._buf[c], type=SCHEMA.field(c).type) for c in RECORD_COLUMNS}, schema=SCHEMA
        )
        self._writer.write_table(table)
        self.written += self._rows
        self._buf = {c: [] for c in RECORD_COLUMNS}
        self._rows = 0
        # Hand the arrays' freed pages back: Arrow's allocator otherwise keeps what each row group
        # grew it to, which read as slow growth in hour-long soaks.
        pa.default_memory_pool().release_unused()

    def missing(self) -> np.ndarray:
        return np.flatnonzero(~self.seen)

    def close(self, fill: dict[str, list[Any]] | None = None) -> None:
        """Write the rows for requests that never reported (``fill``), then close the file."""
        if fill and fill["index"]:
            for c in RECORD_COLUMNS:
                self._buf[c].extend(fill[c])
            self._rows += len(fill["index"])
        self.flush()
        self._writer.close()
