"""Deal the schedule: one Plan per worker (its settings and the first part of its shard), then the
rest of each shard a chunk at a time as the run advances (``Dealer``).

The master holds only a window of the schedule: the chunks dealt whose requests do not all have a
row yet, and the chunk being made. A chunk is dealt when its first request is due within
``SEND_AHEAD_S`` of now, and dropped once each of its requests has a row (or gets one here:
NOT_SENT / WORKER_LOST). See docs/loadgen.md, "Memory".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from netgain.contract.messages import Plan
from netgain.loadgen.runner.config import LoadConfig
from netgain.loadgen.runner.results import fill_missing
from netgain.loadgen.schedule import Schedule
from netgain.loadgen.stream import CHUNK, StreamedSchedule

SEND_AHEAD_S = 5.0  # a chunk is dealt when its first request is due within this of now


def split_concurrency(concurrency: int, workers: int) -> list[int]:
    """Closed-loop users per worker: as even as it goes, the first workers taking the remainder."""
    return [concurrency // workers + (1 if i < concurrency % workers else 0) for i in range(workers)]


def shard_arrays(chunks: list[Schedule], worker: int, workers: int) -> dict[str, bytes]:
    """Worker ``worker``'s requests (index mod ``workers``) of ``chunks``, as a plan's byte fields."""
    out: dict[str, list[np.ndarray]] = {"index": [], "t_ns": [], "size": [], "items": []}
    for c in chunks:
        mine = c.index % workers == worker
        for name in out:
            out[name].append(getattr(c, name)[mine])
    dtypes = {"index": np.int64, "t_ns": np.int64, "size": np.int64, "items": np.int32}
    return {
        name: (np.concatenate(parts) if parts else np.zeros(0, dtypes[name])).astype(dtypes[name]).tobytes()
        for name, parts in out.items()
    }


class Dealer:
    """The streamed schedule, dealt as the run advances; knows which dealt requests have a row."""

    def __init__(self, schedule: StreamedSchedule, workers: int, chunk: int = CHUNK) -> None:
        self.workers = workers
        self.chunk = chunk
        self._it = schedule.chunks(chunk)
        self._next: Schedule | None = next(self._it, None)
        self.pending: deque[tuple[Schedule, np.ndarray]] = deque()  # dealt, not all rows yet
        self.base = 0  # requests below have their rows
        self.dealt = 0  # requests below were dealt
        self.duplicates = self.extra_rows = 0
        self.not_sent = self.worker_lost = 0
        self.peak_pending = 0  # most requests held at once (dealt, waiting for rows)

    @property
    def more(self) -> bool:
        return self._next is not None

    def take(self, horizon_ns: int, at_least_one: bool = False) -> list[Schedule]:
        """The chunks whose first request is due by ``horizon_ns`` (ns since the epoch), now dealt."""
        out: list[Schedule] = []
        while self._next is not None and (
            int(self._next.t_ns[0]) <= horizon_ns or (at_least_one and not out)
        ):
            c = self._next
            out.append(c)
            self.pending.append((c, np.zeros(len(c), dtype=bool)))
            self.dealt += len(c)
            self._next = next(self._it, None)
        self.peak_pending = max(self.peak_pending, self.dealt - self.base)
        return out

    def mark(self, idx: np.ndarray) -> None:
        """Rows arrived for requests ``idx``."""
        old = idx < self.base
        beyond = idx >= self.dealt
        self.duplicates += int(old.sum())
        self.extra_rows += int(beyond.sum())
        idx = idx[~old & ~beyond]
        if not idx.shape[0]:
            return
        pos = idx - self.base
        which = pos // self.chunk  # chunks are all ``chunk`` long but the schedule's last
        for k in np.unique(which):
            seen = self.pending[int(k)][1]
            off = pos[which == k] % self.chunk
            uniq, counts = np.unique(off, return_counts=True)
            self.duplicates += int(seen[uniq].sum()) + int((counts - 1).sum())
            seen[uniq] = True

    def retire(
        self, lost: dict[int, float], *, run_id: str, targets: list[str], final: bool = False
    ) -> Iterator[dict[str, list[Any]]]:
        """Drop the oldest dealt chunks whose requests all have rows, yielding the rows made here
        for those that never will: a lost worker's (WORKER_LOST / NOT_SENT), and at the end
        (``final``) every request without one, dealt or not (NOT_SENT)."""
        lost_mask = np.zeros(self.workers, dtype=bool)
        lost_mask[list(lost)] = True
        while self.pending:
            c, seen = self.pending[0]
            missing = ~seen
            if missing.any() and not final and not lost_mask[c.index[missing] % self.workers].all():
                break  # a live worker's rows are still to come
            self.pending.popleft()
            self.base += len(c)
            if missing.any():
                yield self._fill(c, np.flatnonzero(missing), lost, run_id, targets)
        if final:
            while self._next is not None:  # never dealt: the run ended early
                c = self._next
                self._next = next(self._it, None)
                self.base = self.dealt = self.dealt + len(c)
                yield self._fill(c, np.arange(len(c)), lost, run_id, targets)

    def _fill(
        self, c: Schedule, missing: np.ndarray, lost: dict[int, float], run_id: str, targets: list[str]
    ) -> dict[str, list[Any]]:
        fill = fill_missing(c, missing, workers=self.workers, lost=lost, run_id=run_id, targets=targets)
        lost_rows = sum(1 for s in fill["status"] if s == "WORKER_LOST")
        self.worker_lost += lost_rows
        self.not_sent += len(fill["status"]) - lost_rows
        return fill


def http_form(cfg: LoadConfig) -> dict[str, Any]:
    """The request form an HTTP protocol's senders build: the template (http-json), the tensor
    encoding (oip-http); empty for gRPC."""
    if cfg.protocol == "http-json":
        return dict(cfg.request_template or {})
    if cfg.protocol == "oip-http":
        return {"binary": cfg.oip_binary}
    return {}


def first_plans(
    cfg: LoadConfig,
    first: list[Schedule],
    more: bool,
    warmup_ns: int,
    index_of: dict[str, int],
    workers: int,
    *,
    run_id: str,
    model: str,
    info: Any,
) -> Iterator[tuple[str, Plan]]:
    """(Locust client id, its Plan) for each worker numbered in ``index_of`` (of ``workers``), with
    its shard of the chunks ``first``; ``info`` is the first target's ServerInfo (its handler
    options go to every worker)."""
    users = split_concurrency(cfg.concurrency, workers)
    for cid, i in index_of.items():
        shard = shard_arrays(first, i, workers)
        yield (
            cid,
            Plan(
                run_id=run_id,
                worker=i,
                workers=workers,
                targets=cfg.targets,
                model=model,
                handler_options=dict(info.handler_options),
                seed=cfg.seed,
                mode=cfg.mode,
                warmup_ns=warmup_ns,
                timeout_s=cfg.timeout_s,
                max_in_flight=cfg.max_in_flight,
                connections=cfg.connections,
                concurrency=users[i],
                think_ms=cfg.think_ms,
                duration_ns=int((cfg.warmup_s + cfg.duration_s) * 1e9),
                tls_ca=cfg.tls_ca,
                more=more,
                extra={"payload_variants": cfg.payload_variants},
                protocol=cfg.protocol,
                http=http_form(cfg),
                index=shard["index"],
                t_ns=shard["t_ns"],
                size=shard["size"],
                items=shard["items"],
            ),
        )
