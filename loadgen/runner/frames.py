"""Length-prefixed msgpack frames between a Locust worker and its sender engine (a pipe pair).

A frame is a 4-byte big-endian length and a msgpack array ``[kind, data]``; the kinds are the
message names of ``netgain.contract.messages`` (``PLAN``, ``READY``, ``GO``, ``CHUNK``,
``RECORDS``, ``DONE``, ``STOP``).
"""

from __future__ import annotations

import struct
from typing import IO, Any

import msgpack

from netgain.contract.messages import CHUNK, DONE, GO, PLAN, READY, RECORDS, STOP

__all__ = [
    "CHUNK",
    "DONE",
    "GO",
    "PLAN",
    "READY",
    "RECORDS",
    "STOP",
    "read_exact",
    "read_frame",
    "write_frame",
]
_HEADER = struct.Struct(">I")


def write_frame(out: IO[bytes], kind: str, data: Any) -> None:
    body = msgpack.packb([kind, data], use_bin_type=True)
    out.write(_HEADER.pack(len(body)) + body)
    out.flush()


def read_exact(inp: IO[bytes], n: int) -> bytes | None:
    """``n`` bytes, or None at end of stream (a partial frame is also an end)."""
    chunks, got = [], 0
    while got < n:
        chunk = inp.read(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(inp: IO[bytes]) -> tuple[str, Any] | None:
    """The next ``(kind, data)``, or None when the other side closed the pipe."""
    head = read_exact(inp, _HEADER.size)
    if head is None:
        return None
    body = read_exact(inp, _HEADER.unpack(head)[0])
    if body is None:
        return None
    kind, data = msgpack.unpackb(body, raw=False)
    return str(kind), data
