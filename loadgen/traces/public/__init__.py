"""Public production traces by name: ``netgain trace import FILE --format NAME`` (docs/traces.md).

Each format maps its rows to netgain's trace: arrival offsets from the first request (rows sorted
by time), a payload size, one item per request; the useful source columns ride along as extra
columns of the written file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from netgain.loadgen.traces.public.base import BYTES_PER_TOKEN, Imported
from netgain.loadgen.traces.public.functions import SPREADS, azure_functions
from netgain.loadgen.traces.public.llm import azure_llm, burstgpt, mooncake

#: name -> what it reads (the order `--help` lists them in).
FORMATS = {
    "azure-llm-2023": "Azure LLM inference trace 2023 (CSV: TIMESTAMP, ContextTokens, GeneratedTokens)",
    "azure-llm-2024": "Azure LLM inference trace 2024 (the same columns, a week, times with +00:00)",
    "azure-functions-2019": "Azure Functions trace 2019 (CSV: one function a row, invocations per minute)",
    "mooncake": "Mooncake FAST'25 JSON lines (timestamp ms, input_length, output_length, hash_ids)",
    "burstgpt": "BurstGPT CSV (Timestamp s, Model, Request tokens, Response tokens, ..., Log Type)",
}
TOKEN_FORMATS = ("azure-llm-2023", "azure-llm-2024", "mooncake", "burstgpt")

__all__ = ["BYTES_PER_TOKEN", "FORMATS", "SPREADS", "TOKEN_FORMATS", "Imported", "import_public"]


def import_public(
    path: str | os.PathLike[str],
    fmt: str,
    *,
    bytes_per_token: float = BYTES_PER_TOKEN,
    spread: str = "uniform",
    seed: int = 0,
    triggers: Sequence[str] | None = None,
) -> Imported:
    """Read the public trace ``path`` in format ``fmt`` (a key of FORMATS).

    Token traces: size = input tokens x ``bytes_per_token`` (at least 1 byte; 0 gives every request
    the model's default size). The functions trace: ``spread`` (uniform, with ``seed``, or even)
    places each minute's invocations, ``triggers`` keeps only those trigger groups. Raises
    TraceError naming the file, line and field of a bad value; ValueError for a bad argument.
    """
    p = Path(path)
    if not math.isfinite(bytes_per_token) or bytes_per_token < 0:
        raise ValueError(f"bytes per token {bytes_per_token:g} must be a number >= 0")
    if spread not in SPREADS:
        raise ValueError(f"spread {spread!r}: use {' or '.join(SPREADS)}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}: use one of {', '.join(FORMATS)}")
    if not p.is_file():
        raise FileNotFoundError(f"trace file {str(p)!r} does not exist")
    if fmt == "azure-functions-2019":
        return azure_functions(p, fmt, spread=spread, seed=seed, triggers=triggers)
    read = {"mooncake": mooncake, "burstgpt": burstgpt}.get(fmt, azure_llm)
    return read(p, fmt, bytes_per_token)
