"""The global schedule: every request's intended send time, size and items, fixed before the run.

Built from a trace (file or synthetic, seeded), it is identical for the CPU and GPU
runs of a comparison; its digest goes into meta.json. Sharding deals requests to
workers round-robin by index, so each request belongs to exactly one worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Schedule:
    index: np.ndarray  # int64 global request index
    t_ns: np.ndarray  # int64 intended send time, ns since the run epoch
    size: np.ndarray  # int64 payload size hint in bytes (0: model default)
    items: np.ndarray  # int32 inputs per request
    warmup_ns: int
    digest: str
    source: str

    def __len__(self) -> int:
        return int(self.index.shape[0])

    @property
    def duration_s(self) -> float:
        return float(self.t_ns[-1]) / 1e9 if len(self) else 0.0

    def shard(self, worker: int, workers: int) -> Schedule:
        """Requests ``worker, worker + workers, ...``: a partition of the schedule across workers."""
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} is outside 0..{workers - 1}")
        sl = slice(worker, None, workers)
        return Schedule(
            self.index[sl],
            self.t_ns[sl],
            self.size[sl],
            self.items[sl],
            self.warmup_ns,
            self.digest,
            self.source,
        )


def from_trace(trace: object, warmup_s: float = 0.0) -> Schedule:
    """A schedule from a ``loadgen.traces.Trace`` (arrival offsets in seconds)."""
    t_s = np.asarray(trace.t_s, dtype=np.float64)  # type: ignore[attr-defined]
    t_ns = np.round(t_s * 1e9).astype(np.int64)
    n = t_ns.shape[0]
    return Schedule(
        index=np.arange(n, dtype=np.int64),
        t_ns=t_ns,
        size=np.asarray(trace.size, dtype=np.int64),  # type: ignore[attr-defined]
        items=np.asarray(trace.items, dtype=np.int32),  # type: ignore[attr-defined]
        warmup_ns=int(warmup_s * 1e9),
        digest=trace.digest(),  # type: ignore[attr-defined]
        source=str(getattr(trace, "source", "")),
    )
