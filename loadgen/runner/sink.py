"""Records → requests.parquet, written incrementally; at the end every scheduled request has a row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from netgain.loadgen.runner.wire import SCHEMA, records_batch

COMPACT_BATCHES = 64  # records messages merged into one batch while a row group fills


class RecordSink:
    """Keeps each message of records as the Arrow record batch it arrived as (``add_batch``) and
    writes a row group every ``flush_rows`` rows.

    Memory stays bounded by ``flush_rows`` rows (in Arrow buffers, not Python objects, which
    fragment the heap), plus, when ``scheduled`` is given, one flag byte per scheduled request (to
    know which requests have a row; the master passes None and its Dealer knows, over a window).
    """

    def __init__(self, path: str, scheduled: int | None, flush_rows: int = 50_000) -> None:
        self.path = path
        self.flush_rows = flush_rows
        self._writer = pq.ParquetWriter(path, SCHEMA, compression="zstd")
        self._batches: list[pa.RecordBatch] = []
        self._rows = 0
        self._loose = 0  # batches appended since the last compaction
        # None: the caller tracks which requests have rows (the master's Dealer, over a window)
        self.seen = np.zeros(scheduled or 0, dtype=bool)
        self._track = scheduled is not None
        self.extra_rows = 0  # closed-loop requests beyond the schedule
        self.duplicates = 0
        self.written = 0

    def add_batch(self, batch: pa.RecordBatch) -> None:
        if not self._track:
            self._append(batch)
            if self._rows >= self.flush_rows:
                self.flush()
            return
        idx = batch.column("index").to_numpy(zero_copy_only=False)
        inside = (idx >= 0) & (idx < self.seen.shape[0])
        self.extra_rows += int((~inside).sum())
        idx = idx[inside]
        # A repeat inside one batch counts too: np.unique's counts beyond the first.
        uniq, counts = np.unique(idx, return_counts=True)
        self.duplicates += int(self.seen[uniq].sum()) + int((counts - 1).sum())
        self.seen[uniq] = True
        self._append(batch)
        if self._rows >= self.flush_rows:
            self.flush()

    def _append(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._batches.append(batch)
            self._rows += batch.num_rows
            self._loose += 1
            if self._loose >= COMPACT_BATCHES:
                self._compact()

    def _compact(self) -> None:
        """The batches since the last compaction as one: a message's batch of a few dozen rows costs
        ~1 KB a row in buffers and objects, a compacted one what its values take."""
        loose = self._batches[-self._loose :]
        self._batches[-self._loose :] = [pa.concat_batches(loose)]
        self._loose = 0

    def flush(self) -> None:
        if not self._rows:
            return
        self._writer.write_table(pa.Table.from_batches(self._batches, schema=SCHEMA))
        self.written += self._rows
        self._batches = []
        self._rows = 0
        self._loose = 0
        # Hand the arrays' freed pages back: Arrow's allocator otherwise keeps what each row group
        # grew it to.
        pa.default_memory_pool().release_unused()

    def missing(self) -> np.ndarray:
        return np.flatnonzero(~self.seen)

    def add_rows(self, cols: dict[str, list[Any]]) -> None:
        """Rows made by the master (requests that never reported)."""
        self.add_batch(records_batch(cols))

    def close(self, fill: dict[str, list[Any]] | None = None) -> None:
        """Write the rows for requests that never reported (``fill``), then close the file."""
        if fill:
            self._append(records_batch(fill))
        self.flush()
        self._writer.close()
