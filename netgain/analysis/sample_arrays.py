"""samples.parquet as numpy arrays, read a batch at a time: what the report holds of the scraped samples.

A row is its time, its value and one integer naming its series (source, metric, labels): 20 bytes,
where the file's three strings per row, read whole and turned into Python lists, cost ~500 (a
24-hour run's 1.7 million rows took ~850 MB). The few distinct series are kept once, in ``keys``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from netgain.contract.records import SAMPLE_COLUMNS

KEY_COLUMNS = ("source", "metric", "labels")
BATCH_ROWS = 1 << 16

Key = tuple[str | None, str | None, str | None]  # (source, metric, labels); None where the file has null


@dataclass
class SampleArrays:
    keys: list[Key]  # the series, by code
    code: np.ndarray  # int32 per row: its series' index in ``keys``
    t: np.ndarray  # float64 seconds since the run's epoch
    value: np.ndarray  # float64

    @property
    def num_rows(self) -> int:
        return len(self.t)


class _Encoder:
    """Assigns each distinct (source, metric, labels) a code, in order of first appearance."""

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self._codes: dict[Key, int] = {}

    def code(self, key: Key) -> int:
        c = self._codes.get(key)
        if c is None:
            c = self._codes[key] = len(self.keys)
            self.keys.append(key)
        return c

    def rows(self, table: pa.Table | pa.RecordBatch) -> np.ndarray:
        """The code of each row of ``table``."""
        idx, values = [], []
        for name in KEY_COLUMNS:
            enc = pc.dictionary_encode(table.column(name), null_encoding="encode")
            if isinstance(enc, pa.ChunkedArray):
                enc = enc.combine_chunks() if enc.num_chunks != 1 else enc.chunk(0)
            idx.append(np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64))
            values.append(enc.dictionary.to_pylist())
        n_m, n_l = max(1, len(values[1])), max(1, len(values[2]))
        combo = (idx[0] * n_m + idx[1]) * n_l + idx[2]
        uniq, inverse = np.unique(combo, return_inverse=True)
        to_code = np.empty(len(uniq), np.int32)
        for j, u in enumerate(uniq.tolist()):
            s, rest = divmod(u, n_m * n_l)
            m, lab = divmod(rest, n_l)
            to_code[j] = self.code((values[0][s], values[1][m], values[2][lab]))
        return to_code[inverse.reshape(-1)] if len(combo) else np.zeros(0, np.int32)


def _join(encoder: _Encoder, parts: Iterable[pa.Table | pa.RecordBatch], n: int) -> SampleArrays:
    """The ``n`` rows of ``parts`` into arrays allocated once (no list of pieces to concatenate)."""
    out = SampleArrays(encoder.keys, np.empty(n, np.int32), np.empty(n), np.empty(n))
    at = 0
    for part in parts:
        m = part.num_rows
        out.code[at : at + m] = encoder.rows(part)
        out.t[at : at + m] = part.column("t_s").to_numpy(zero_copy_only=False)
        out.value[at : at + m] = part.column("value").to_numpy(zero_copy_only=False)
        at += m
    return out


def from_table(table: pa.Table) -> SampleArrays:
    """A samples table already in memory."""
    return _join(_Encoder(), [table] if table.num_rows else [], table.num_rows)


def _parts(pf: pq.ParquetFile, batch_rows: int) -> Iterator[pa.Table | pa.RecordBatch]:
    # A row group at a time on this thread: decoding on Arrow's threads left ~30 MB more resident
    # for 1.7 million rows than one thread did; a larger group in batches of ``batch_rows``.
    columns = list(SAMPLE_COLUMNS)
    for i in range(pf.metadata.num_row_groups):
        if pf.metadata.row_group(i).num_rows <= batch_rows:
            yield pf.read_row_group(i, columns=columns, use_threads=False)
        else:
            yield from pf.iter_batches(
                batch_size=batch_rows, row_groups=[i], columns=columns, use_threads=False
            )


def read(pf: pq.ParquetFile, batch_rows: int = BATCH_ROWS) -> SampleArrays:
    """samples.parquet, a row group (or ``batch_rows`` rows) at a time; Arrow errors propagate."""
    return _join(_Encoder(), _parts(pf, batch_rows), pf.metadata.num_rows)


def to_table(s: SampleArrays, schema: pa.Schema) -> pa.Table:
    """The rows of ``s`` as a samples table of ``schema``."""
    code = pa.array(s.code, pa.int32())
    cols = {
        name: pa.DictionaryArray.from_arrays(
            code, pa.array([k[i] for k in s.keys], schema.field(name).type)
        ).dictionary_decode()
        for i, name in enumerate(KEY_COLUMNS)
    }
    data = {"t_s": pa.array(s.t), **cols, "value": pa.array(s.value)}
    return pa.table({f.name: data[f.name].cast(f.type) for f in schema}, schema=schema)
