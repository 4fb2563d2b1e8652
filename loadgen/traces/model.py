"""The in-memory trace: arrival offsets, payload sizes and items per request."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


class TraceError(ValueError):
    """A trace that cannot be used, with the file, line (1-based, header = line 1) and field when known."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        field: str | None = None,
        unit: str = "line",
    ) -> None:
        self.path = path
        self.line = line
        self.field = field
        where = ""
        at = "" if line is None else (f":{line}" if unit == "line" else f": {unit} {line}")
        if path is not None:
            where = f"{path}{at}: "
        elif line is not None:
            where = f"{unit} {line}: "
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{where}{what}{message}")


def _frozen(a: np.ndarray) -> np.ndarray:
    """A read-only copy (never freezes the caller's array)."""
    a = np.array(a, copy=True, order="C")
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Trace:
    """Recorded or synthetic traffic: one row per request, ordered by arrival.

    ``t_s`` are float64 offsets in seconds from the trace start (non-decreasing, first >= 0),
    ``size`` int64 payload bytes (0 = the model's default size), ``items`` int32 inputs per
    request (the client batch size, >= 1). Arrays are read-only.
    """

    t_s: np.ndarray
    size: np.ndarray
    items: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        t = np.asarray(self.t_s, dtype=np.float64).reshape(-1)
        n = t.shape[0]
        size = np.asarray(self.size, dtype=np.int64).reshape(-1)
        items = np.asarray(self.items, dtype=np.int32).reshape(-1)
        if size.shape[0] != n or items.shape[0] != n:
            raise TraceError(
                f"t_s, size and items must have the same length, got {n}, "
                f"{size.shape[0]} and {items.shape[0]}"
            )
        if n:
            if not np.isfinite(t).all():
                raise TraceError("arrival times must be finite", field="t")
            if t[0] < 0:
                raise TraceError(
                    f"the first arrival time is {t[0]!r}; offsets start at 0 or later", field="t"
                )
            if n > 1 and (np.diff(t) < 0).any():
                raise TraceError("arrival times must be non-decreasing", field="t")
            if (size < 0).any():
                raise TraceError("payload sizes must be >= 0", field="size")
            if (items < 1).any():
                raise TraceError("items per request must be >= 1", field="items")
        object.__setattr__(self, "t_s", _frozen(t))
        object.__setattr__(self, "size", _frozen(size))
        object.__setattr__(self, "items", _frozen(items))

    def __len__(self) -> int:
        return int(self.t_s.shape[0])

    @property
    def duration_s(self) -> float:
        """Seconds from the trace start (offset 0) to the last arrival."""
        return float(self.t_s[-1]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over ``duration_s`` (0 for an empty or instantaneous trace)."""
        d = self.duration_s
        return len(self) / d if d > 0 else 0.0

    def digest(self) -> str:
        """sha256 over t rounded to ns (int64), size (int64) and items (int32), little-endian."""
        h = hashlib.sha256()
        h.update(np.round(self.t_s * 1e9).astype("<i8").tobytes())
        h.update(self.size.astype("<i8").tobytes())
        h.update(self.items.astype("<i4").tobytes())
        return h.hexdigest()

    def __eq__(self, other: object) -> bool:
        """Same traffic (same digest); ``source`` is a description and does not count."""
        if not isinstance(other, Trace):
            return NotImplemented
        return len(self) == len(other) and self.digest() == other.digest()

    def __hash__(self) -> int:
        return hash(self.digest())

    def __repr__(self) -> str:
        return (
            f"Trace({len(self)} requests over {self.duration_s:.3f} s, "
            f"{self.mean_rate:.1f} req/s, source={self.source!r})"
        )
