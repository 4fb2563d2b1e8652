"""LLM inference traces: Azure LLM inference (2023, 2024), Mooncake (FAST'25) and BurstGPT.

Each row is one request: its arrival time, its input (prompt) tokens and output tokens. The
payload size is the input tokens times ``bytes_per_token`` (base.token_bytes); the token counts
and the other useful columns are kept beside the trace as extra columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from netgain.loadgen.traces.access_log import times_s
from netgain.loadgen.traces.io import csv_locator, jsonl_locator, jsonl_objects, whole_numbers
from netgain.loadgen.traces.model import TraceError
from netgain.loadgen.traces.public.base import (
    Imported,
    failer,
    read_csv_columns,
    sorted_import,
    token_bytes,
)

NO_HINT = ""  # the --time-format hint of an access log does not apply to a named format


def _size_note(name: str, rows: int, input_col: str, bytes_per_token: float, kept: list[str]) -> str:
    size = (
        "size 0 (the model's default)"
        if bytes_per_token == 0
        else f"size = {input_col} x {bytes_per_token:g} bytes (at least 1)"
    )
    return f"{name}: {rows:,} rows, one request each; {size}; kept {', '.join(kept)}"


def azure_llm(path: Path, name: str, bytes_per_token: float) -> Imported:
    """Azure LLM inference trace (2023 or 2024): ``TIMESTAMP`` (ISO date-time, 2023 without a zone
    and 7 fractional digits, 2024 with ``+00:00``), ``ContextTokens``, ``GeneratedTokens``."""
    table = read_csv_columns(path, name, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    fail = failer(path, csv_locator(path))
    t = times_s(table.column("TIMESTAMP"), "TIMESTAMP", "iso", fail, NO_HINT)
    context = whole_numbers(table.column("ContextTokens"), "ContextTokens", "tokens", fail)
    generated = whole_numbers(table.column("GeneratedTokens"), "GeneratedTokens", "tokens", fail)
    extra = {"input_tokens": pa.array(context), "output_tokens": pa.array(generated)}
    note = _size_note(name, len(t), "ContextTokens", bytes_per_token, list(extra))
    return sorted_import(t, token_bytes(context, bytes_per_token), extra, f"{name}:{path}", note)


BURSTGPT_REQUIRED = ("Timestamp", "Request tokens", "Response tokens")
# source column -> extra column; Session ID and Elapsed time are in the files of release v2.0 on.
BURSTGPT_KEPT = {"Model": "model", "Log Type": "log_type", "Session ID": "session_id"}


def burstgpt(path: Path, name: str, bytes_per_token: float) -> Imported:
    """BurstGPT: ``Timestamp`` (seconds), ``Model``, ``Request tokens``, ``Response tokens``,
    ``Total tokens``, ``Log Type``; newer files add ``Session ID`` and ``Elapsed time`` (s) as
    the second and third columns, so columns are found by name."""
    optional = (*BURSTGPT_KEPT, "Elapsed time")
    table = read_csv_columns(path, name, BURSTGPT_REQUIRED, optional)
    fail = failer(path, csv_locator(path))
    t = times_s(table.column("Timestamp"), "Timestamp", "s", fail, NO_HINT)
    request = whole_numbers(table.column("Request tokens"), "Request tokens", "tokens", fail)
    response = whole_numbers(table.column("Response tokens"), "Response tokens", "tokens", fail)
    extra: dict[str, pa.Array] = {"input_tokens": pa.array(request), "output_tokens": pa.array(response)}
    for source, kept in BURSTGPT_KEPT.items():
        if source in table.column_names:
            extra[kept] = table.column(source).combine_chunks()
    if "Elapsed time" in table.column_names:
        extra["elapsed_s"] = _optional_seconds(table.column("Elapsed time"), fail)
    note = _size_note(name, len(t), "Request tokens", bytes_per_token, list(extra))
    return sorted_import(t, token_bytes(request, bytes_per_token), extra, f"{name}:{path}", note)


def _optional_seconds(col: pa.ChunkedArray, fail: Any) -> pa.Array:
    """``Elapsed time``: seconds, empty where the source has none (kept as null, not an error)."""
    out: list[float | None] = []
    for i, raw in enumerate(col.to_pylist()):
        text = (raw or "").strip()
        if not text:
            out.append(None)
            continue
        try:
            v = float(text)
        except ValueError:
            raise fail(i, "Elapsed time", f"{raw!r} is not a number of seconds") from None
        if not np.isfinite(v) or v < 0:
            raise fail(i, "Elapsed time", f"{raw!r} is not a number of seconds >= 0")
        out.append(v)
    return pa.array(out, type=pa.float64())


MOONCAKE_REQUIRED = ("timestamp", "input_length", "output_length")


def mooncake(path: Path, name: str, bytes_per_token: float) -> Imported:
    """Mooncake JSON lines: ``timestamp`` (milliseconds), ``input_length``, ``output_length`` (tokens)
    and ``hash_ids`` (the prompt's KV-cache block ids: equal ids, a shared prefix), kept as a list."""
    locate = jsonl_locator(path)
    fail = failer(path, locate)
    try:
        table = pajson.read_json(path, read_options=pajson.ReadOptions(block_size=1 << 24))
        if not all(c in table.column_names for c in MOONCAKE_REQUIRED) or (
            "hash_ids" in table.column_names and not pa.types.is_list(table.column("hash_ids").type)
        ):
            table = _mooncake_slow(path)  # names the line without the field
    except pa.ArrowInvalid:
        table = _mooncake_slow(path)  # names the bad line
    if table.num_rows == 0:
        table = pa.table({c: pa.array([], type=pa.int64()) for c in MOONCAKE_REQUIRED})
    t = times_s(table.column("timestamp"), "timestamp", "ms", fail, NO_HINT)
    inputs = whole_numbers(table.column("input_length"), "input_length", "tokens", fail)
    outputs = whole_numbers(table.column("output_length"), "output_length", "tokens", fail)
    extra: dict[str, pa.Array] = {"input_tokens": pa.array(inputs), "output_tokens": pa.array(outputs)}
    if "hash_ids" in table.column_names:
        extra["hash_ids"] = table.column("hash_ids").combine_chunks()
    note = _size_note(name, len(t), "input_length", bytes_per_token, list(extra))
    return sorted_import(t, token_bytes(inputs, bytes_per_token), extra, f"{name}:{path}", note)


def _mooncake_slow(path: Path) -> pa.Table:
    """Line by line, for a file pyarrow refuses or one missing a field: names the first bad line."""
    cols: dict[str, list[Any]] = {c: [] for c in (*MOONCAKE_REQUIRED, "hash_ids")}
    for lineno, rec in jsonl_objects(path):
        for c in MOONCAKE_REQUIRED:
            v = rec.get(c)
            if v is None:
                raise TraceError("missing; a Mooncake record has it", path=str(path), line=lineno, field=c)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise TraceError(f"{v!r} is not a number", path=str(path), line=lineno, field=c)
            cols[c].append(float(v))
        ids = rec.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            raise TraceError(
                "expected a list of whole numbers", path=str(path), line=lineno, field="hash_ids"
            )
        cols["hash_ids"].append(ids)
    return pa.table(
        {
            **{c: pa.array(cols[c], type=pa.float64()) for c in MOONCAKE_REQUIRED},
            "hash_ids": pa.array(cols["hash_ids"], type=pa.list_(pa.int64())),
        }
    )
