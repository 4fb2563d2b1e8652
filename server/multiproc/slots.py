"""The hand-off between frontend processes and the device process: shared-memory slots and
fixed-layout records on pipes.

Each frontend owns one ring of fixed-size slots in an anonymous shared mapping made by the
supervisor before it forks (no names to leak, nothing in /dev/shm). A slot holds one
pre-processed item; the device process reads it in place while collating, then writes the
item's output row back into the same slot. Only the owner's free list hands slots out, so
no lock crosses processes. Records on the pipes stay under PIPE_BUF, so each write is atomic.
"""

from __future__ import annotations

import itertools
import mmap
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from netgain.protos import inference_pb2 as pb

# Item layout in a slot: kind, dtype, ndim, pad, nbytes, then up to 8 dims.
_ITEM = struct.Struct("<BBBxxxxxQ8q")
ITEM_HEADER = _ITEM.size
TENSOR, PICKLE, INPUT = 1, 2, 3  # INPUT: a request item (pb.Input) as its wire bytes, no pickle around it
MAX_DIMS = 8

# any frontend -> every frontend (one shared pipe): origin frontend, items, first slot, seq,
# deadline_ns, trace id and span id (zeros when not traced: the device links batch spans to them)
WORK = struct.Struct("<HHIQq16s8s")
# frontend -> device: origin, code, items, seq, deadline_ns (0: none), handed_ns, pre_ns, message
# bytes, trace id, span id; then items x u32 slot, then the message (a failed pre-processing,
# answered by the device)
REQUEST = struct.Struct("<HHIQqqqH16s8s")
# A request's slots are chained in the owner ring's claim table (column NEXT); its first slot's
# TAKER says who is pre-processing it, so the device can answer what a dead frontend held.
TAKER, SEQ, NEXT = 0, 1, 2
QUEUED, HANDED = -1, -2
# device -> frontend: seq, code, batch_id, batch_size, pre, h2d, kernel, d2h (ns), message bytes
REPLY = struct.Struct("<QHqIqqqqH")
MAX_MESSAGE = 1024
MAX_ITEMS_PER_RECORD = (4096 - REQUEST.size - MAX_MESSAGE) // 4

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


_NUMPY: dict[Any, Any] = {}  # torch dtype -> the numpy dtype Tensor.numpy() views it as (not bfloat16)


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
    names = ("float32", "float64", "float16", None, "int64", "int32", "int16", "int8", "uint8", "bool")
    _NUMPY.update({t: np.dtype(n) for t, n in zip(_DTYPES, names, strict=True) if n})
    return _DTYPES


class SlotTooSmall(ValueError):
    """A pre-processed item or an output row does not fit its slot."""


class Ring:
    """``slots`` slots of ``slot_bytes`` each in one shared anonymous mapping, and a claim table."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.mm = mmap.mmap(-1, slots * slot_bytes + slots * 3 * 8, flags=mmap.MAP_SHARED)
        self.view = np.frombuffer(self.mm, dtype=np.uint8, count=slots * slot_bytes)
        self.claims = np.frombuffer(self.mm, dtype=np.int64, offset=slots * slot_bytes).reshape(slots, 3)
        self.claims[:, TAKER] = HANDED

    def chain(self, slots: list[int], seq: int) -> None:
        """Record a request's slots (first to last) and mark it queued for any frontend to take."""
        c = self.claims
        for a, b in itertools.pairwise(slots):
            c[a, NEXT] = b
        c[slots[-1], NEXT] = -1
        c[slots[0], SEQ] = seq
        c[slots[0], TAKER] = QUEUED

    def chained(self, first: int, n: int) -> list[int]:
        out = [first]
        for _ in range(n - 1):
            out.append(int(self.claims[out[-1], NEXT]))
        return out

    def _span(self, slot: int, nbytes: int) -> np.ndarray:
        if nbytes + ITEM_HEADER > self.slot_bytes:
            raise SlotTooSmall(
                f"{nbytes} bytes do not fit a {self.slot_bytes}-byte hand-off slot "
                "(serve with --workers 0 for items of unbounded size)"
            )
        start = slot * self.slot_bytes + ITEM_HEADER
        return self.view[start : start + nbytes]

    def put(self, slot: int, value: Any) -> None:
        """Write a tensor (raw bytes), a request item (its wire bytes) or any other value (pickled)
        into ``slot``."""
        import torch

        if type(value) is pb.Input:  # every raw item a frontend hands over: about half of pickle's cost
            self._put_bytes(slot, INPUT, value.SerializeToString())
            return
        base = slot * self.slot_bytes
        if isinstance(value, torch.Tensor) and value.dim() <= MAX_DIMS:
            code = _dtypes().index(value.dtype)
            t = value.detach().contiguous()
            if t.device.type != "cpu":
                t = t.cpu()
            dims = list(t.shape) + [0] * (MAX_DIMS - t.dim())
            nbytes = t.numel() * t.element_size()
            dst = self._span(slot, nbytes)
            if nbytes:
                if t.dtype in _NUMPY:  # a numpy copy costs a fraction of a torch op's dispatch
                    dst[:] = t.numpy().reshape(-1).view(np.uint8)
                else:
                    torch.from_numpy(dst).copy_(t.reshape(-1).view(torch.uint8))
            _ITEM.pack_into(self.mm, base, TENSOR, code, t.dim(), nbytes, *dims)
            return
        self._put_bytes(slot, PICKLE, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def _put_bytes(self, slot: int, kind: int, data: bytes) -> None:
        self._span(slot, len(data))[:] = np.frombuffer(data, dtype=np.uint8)
        _ITEM.pack_into(self.mm, slot * self.slot_bytes, kind, 0, 0, len(data), *([0] * MAX_DIMS))

    def get(self, slot: int) -> Any:
        """The value in ``slot``; a tensor is a view of the shared memory (valid until reused)."""
        import torch

        base = slot * self.slot_bytes
        kind, code, ndim, nbytes, *dims = _ITEM.unpack_from(self.mm, base)
        raw = self._span(slot, nbytes)
        if kind == INPUT:
            return pb.Input.FromString(raw.tobytes())
        if kind == PICKLE:
            return pickle.loads(raw.tobytes())
        dtype = _dtypes()[code]
        shape = dims[:ndim]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        np_dtype = _NUMPY.get(dtype)
        if np_dtype is not None:
            return torch.from_numpy(raw.view(np_dtype).reshape(shape))
        return torch.from_numpy(raw).view(dtype).reshape(shape)

    def close(self) -> None:
        self.view = np.empty(0, dtype=np.uint8)
        self.mm.close()


@dataclass(frozen=True)
class SlotRef:
    """One item of a handed-over request: which frontend's ring, which slot."""

    frontend: int
    slot: int


def encode_request(
    origin: int,
    seq: int,
    deadline_ns: int,
    handed_ns: int,
    pre_ns: int,
    slots: list[int],
    code: str = "OK",
    message: str = "",
    trace: tuple[bytes, bytes] = (b"", b""),
) -> bytes:
    msg = message.encode("utf-8", "replace")[:MAX_MESSAGE]
    idx = CODES.index(code) if code in CODES else CODES.index("UNKNOWN")
    head = REQUEST.pack(origin, idx, len(slots), seq, deadline_ns, handed_ns, pre_ns, len(msg), *trace)
    return head + struct.pack(f"<{len(slots)}I", *slots) + msg


def encode_reply(
    seq: int, code: str, batch_id: int, batch_size: int, spans: tuple[int, int, int, int], message: str = ""
) -> bytes:
    msg = message.encode("utf-8", "replace")[:MAX_MESSAGE]
    idx = CODES.index(code) if code in CODES else CODES.index("UNKNOWN")
    return REPLY.pack(seq, idx, batch_id, batch_size, *spans, len(msg)) + msg
