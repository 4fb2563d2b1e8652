"""The wire form (Arrow IPC) of request records between workers and the master; the columns and
their schema are ``netgain.contract.records``.

Apart from the sink so a worker, which only encodes, does not import pyarrow.parquet (~8 MB).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from netgain.contract.records import RECORD_COLUMNS, record_schema

SCHEMA = record_schema()


def records_batch(cols: dict[str, list[Any]]) -> pa.RecordBatch:
    """Record columns (Python lists, None for missing) → one Arrow record batch."""
    return pa.RecordBatch.from_arrays(
        [pa.array(cols[c], type=SCHEMA.field(c).type) for c in RECORD_COLUMNS], schema=SCHEMA
    )


def encode_records(cols: dict[str, list[Any]]) -> bytes:
    """Record columns → Arrow IPC stream bytes, as workers send them to the master.

    The master then decodes a message into a few Arrow buffers instead of Python objects per
    record, whose churn among longer-lived objects keeps Python's allocator from returning arenas."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_batch(records_batch(cols))
    return sink.getvalue().to_pybytes()


def decode_records(data: bytes) -> pa.RecordBatch:
    with pa.ipc.open_stream(data) as reader:
        batches = list(reader)
    if len(batches) != 1 or batches[0].schema != SCHEMA:
        raise ValueError("records message is not one record batch of the records schema")
    return batches[0]
