"""The hand-off between frontend processes and the device process: shared-memory slots and
fixed-layout records on pipes.

Each frontend owns one ring of fixed-size slots in an anonymous shared mapping made by the
supervisor before it forks (no names to leak, nothing in /dev/shm). A slot holds one
pre-processed item; the device process reads it in place while collating, then writes the
item's output row back into the same slot. Only the owner's free list hands slots out, so
no lock crosses processes. Records on the pipes stay under PIPE_BUF, so each write is atomic.
"""

from __future__ import annotations

import mmap
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

# Item layout in a slot: kind, dtype, ndim, pad, nbytes, then up to 8 dims.
_ITEM = struct.Struct("<BBBxxxxxQ8q")
ITEM_HEADER = _ITEM.size
TENSOR, PICKLE = 1, 2
MAX_DIMS = 8

# frontend -> device: seq, deadline_ns (0: none), handed_ns, items; then items x u32 slot
REQUEST = struct.Struct("<QqqI")
# device -> frontend: seq, code, batch_id, batch_size, pre, h2d, kernel, d2h (ns), message bytes
REPLY = struct.Struct("<QHqIqqqqH")
MAX_MESSAGE = 1024
MAX_ITEMS_PER_RECORD = (4096 - REQUEST.size) // 4

CODES = (
    "OK",
    "INVALID_ARGUMENT",
    "INTERNAL",
    "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED",
    "UNAVAILABLE",
    "CANCELLED",
    "UNKNOWN",
)


_DTYPES: list[Any] = []


def _dtypes() -> list[Any]:
    if _DTYPES:
        return _DTYPES
    import torch

    _DTYPES[:] = [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    ]
    return _DTYPES


class SlotTooSmall(ValueError):
    """A pre-processed item or an output row does not fit its slot."""


class Ring:
    """``slots`` slots of ``slot_bytes`` each in one shared anonymous mapping."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.mm = mmap.mmap(-1, slots * slot_bytes, flags=mmap.MAP_SHARED)
        self.view = np.frombuffer(self.mm, dtype=np.uint8)

    def _span(self, slot: int, nbytes: int) -> np.ndarray:
        if nbytes + ITEM_HEADER > self.slot_bytes:
            raise SlotTooSmall(
                f"{nbytes} bytes do not fit a {self.slot_bytes}-byte hand-off slot "
                "(serve with --workers 0 for items of unbounded size)"
            )
        start = slot * self.slot_bytes + ITEM_HEADER
        return self.view[start : start + nbytes]

    def put(self, slot: int, value: Any) -> None:
        """Write a tensor (raw bytes) or any other value (pickled) into ``slot``."""
        import torch

        base = slot * self.slot_bytes
        if isinstance(value, torch.Tensor) and value.dim() <= MAX_DIMS:
            t = value.detach().contiguous()
            if t.device.type != "cpu":
                t = t.cpu()
            dims = list(t.shape) + [0] * (MAX_DIMS - t.dim())
            nbytes = t.numel() * t.element_size()
            dst = self._span(slot, nbytes)
            if nbytes:
                torch.from_numpy(dst).copy_(t.reshape(-1).view(torch.uint8))
            code = _dtypes().index(t.dtype)
            _ITEM.pack_into(self.mm, base, TENSOR, code, t.dim(), nbytes, *dims)
            return
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        self._span(slot, len(data))[:] = np.frombuffer(data, dtype=np.uint8)
        _ITEM.pack_into(self.mm, base, PICKLE, 0, 0, len(data), *([0] * MAX_DIMS))

    def get(self, slot: int) -> Any:
        """The value in ``slot``; a tensor is a view of the shared memory (valid until reused)."""
        import torch

        base = slot * self.slot_bytes
        kind, code, ndim, nbytes, *dims = _ITEM.unpack_from(self.mm, base)
        raw = self._span(slot, nbytes)
        if kind == PICKLE:
            return pickle.loads(raw.tobytes())
        dtype = _dtypes()[code]
        shape = dims[:ndim]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.from_numpy(raw).view(dtype).reshape(shape)

    def close(self) -> None:
        self.view = np.empty(0, dtype=np.uint8)
        self.mm.close()


@dataclass(frozen=True)
class SlotRef:
    """One item of a handed-over request: which frontend's ring, which slot."""

    frontend: int
    slot: int


def encode_request(seq: int, deadline_ns: int, handed_ns: int, slots: list[int]) -> bytes:
    return REQUEST.pack(seq, deadline_ns, handed_ns, len(slots)) + struct.pack(f"<{len(slots)}I", *slots)


def encode_reply(
    seq: int, code: str, batch_id: int, batch_size: int, spans: tuple[int, int, int, int], message: str = ""
) -> bytes:
    msg = message.encode("utf-8", "replace")[:MAX_MESSAGE]
    idx = CODES.index(code) if code in CODES else CODES.index("UNKNOWN")
    return REPLY.pack(seq, idx, batch_id, batch_size, *spans, len(msg)) + msg


def read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from a blocking pipe, or None at end of file."""
    import os

    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
