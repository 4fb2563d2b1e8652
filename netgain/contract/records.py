"""The columns of a run directory's tables: one request record per scheduled request
(``requests.parquet``, and the records workers send the master), and the scraped samples
(``samples.parquet``). See docs/run-directory.md.

Types are named by their pyarrow factory (``pa.int64()``...), and the Arrow schemas are built on
first use: the sender engine, which only fills columns, does not import pyarrow.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from netgain.contract.phases import PHASES

if TYPE_CHECKING:
    import pyarrow as pa

#: ``queue_ms`` ... ``post_ms``: a server phase from the trailer, in ms (the span log's names too).
PHASE_COLUMNS: tuple[str, ...] = tuple(f"{p}_ms" for p in PHASES)

#: (column, pyarrow type factory) of a request record, in file order.
RECORD_TYPES: tuple[tuple[str, str], ...] = (
    ("index", "int64"),
    ("request_id", "string"),
    ("worker", "int32"),
    ("target", "string"),
    ("warmup", "bool_"),
    ("scheduled_ns", "int64"),
    ("sent_ns", "int64"),
    ("done_ns", "int64"),
    ("status", "string"),
    ("http_status", "int32"),  # the answer's HTTP status (HTTP protocols; null for gRPC, unanswered)
    ("error", "string"),  # a failure's short reason, one line (null on OK)
    ("items", "int32"),
    ("request_bytes", "int64"),
    ("response_bytes", "int64"),
    ("batch_id", "int64"),
    ("batch_size", "int32"),
    *((c, "float64") for c in PHASE_COLUMNS),
    ("server_total_ms", "float64"),
)
RECORD_COLUMNS: tuple[str, ...] = tuple(name for name, _ in RECORD_TYPES)
#: The columns that come from the server's ``server-timing`` trailer (None when it had none).
SERVER_COLUMNS: tuple[str, ...] = ("batch_id", "batch_size", *PHASE_COLUMNS, "server_total_ms")
#: The columns a reader cannot do without; the others may be missing (read as null).
REQUIRED_COLUMNS: tuple[str, ...] = ("scheduled_ns", "sent_ns", "done_ns", "status", "warmup")

#: (column, pyarrow type factory) of a scraped sample, in file order.
SAMPLE_TYPES: tuple[tuple[str, str], ...] = (
    ("t_s", "float64"),
    ("source", "string"),
    ("metric", "string"),
    ("labels", "string"),
    ("value", "float64"),
)
SAMPLE_COLUMNS: tuple[str, ...] = tuple(name for name, _ in SAMPLE_TYPES)


def empty_columns() -> dict[str, list[Any]]:
    """A request record per index of each list, filled column by column."""
    return {c: [] for c in RECORD_COLUMNS}


def _schema(types: tuple[tuple[str, str], ...]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, factory)()) for name, factory in types])


@cache
def record_schema() -> pa.Schema:
    """The Arrow schema of ``requests.parquet`` and of the records workers send."""
    return _schema(RECORD_TYPES)


@cache
def sample_schema() -> pa.Schema:
    """The Arrow schema of ``samples.parquet``."""
    return _schema(SAMPLE_TYPES)
