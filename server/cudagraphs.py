"""CUDA graphs of the forward pass, for handlers whose batches have fixed shapes.

At batch size 1 a GPU forward pass is launch-bound; a graph replays it with one launch
(docs/benchmarks.md). One graph is captured per power-of-two batch bucket; a
batch of n rows is copied into the first n rows of its bucket's static input, the graph is
replayed, and the first n output rows are read. Rows are independent in the built-in
models (eval-mode norms, per-row attention), so the stale rows past n never leak into them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from netgain.server.handlers.base import Handler


def bucket(rows: int) -> int:
    """The power of two that holds ``rows`` (1, 2, 4, 8, ...)."""
    return 1 << max(0, rows - 1).bit_length()


def _leaves(batch: Any) -> list[Any]:
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in _leaves(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in _leaves(v)]
    return [batch]


def _like(batch: Any, rows: int, device: Any) -> Any:
    import torch

    if isinstance(batch, dict):
        return {k: _like(v, rows, device) for k, v in batch.items()}
    return torch.zeros((rows, *batch.shape[1:]), dtype=batch.dtype, device=device)


@dataclass
class Graph:
    graph: Any
    static_in: Any
    static_out: Any
    # Timing events recorded as the graph's first and last nodes: they fire when the graph starts
    # and ends on the GPU, so the kernel span excludes the wait for the launch (None if unsupported).
    start: Any = None
    end: Any = None

    def kernel_ms(self) -> float | None:
        """GPU time of the last replay, read after the caller's synchronisation."""
        if self.start is None:
            return None
        try:
            return float(self.start.elapsed_time(self.end))
        except RuntimeError:  # events not usable here: fall back to the caller's for good
            self.start = self.end = None
            return None


class GraphCache:
    def __init__(self, handler: Handler, model: Any, device: Any, dtype: Any | None) -> None:
        self.handler = handler
        self.model = model
        self.device = device
        self.dtype = dtype  # autocast dtype, or None for float32
        self.graphs: dict[tuple[Any, ...], Graph] = {}

    def _autocast(self) -> Any:
        import torch

        if self.dtype is None:
            return contextlib.nullcontext()
        # The autocast weight cache cannot live across graph capture and replay.
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled=False)

    def _key(self, batch: Any, rows: int) -> tuple[Any, ...]:
        return (bucket(rows), *((tuple(t.shape[1:]), t.dtype) for t in _leaves(batch)))

    def stage(self, batch: Any, rows: int) -> Graph:
        """Copy a host batch into its graph's static input (asynchronously, on the current stream)."""
        key = self._key(batch, rows)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(batch, bucket(rows))
        for dst, src in zip(_leaves(entry.static_in), _leaves(batch), strict=True):
            dst[:rows].copy_(src, non_blocking=True)
        return entry

    @staticmethod
    def replay(entry: Graph, rows: int) -> Any:
        entry.graph.replay()
        return entry.static_out[:rows]

    def _capture(self, batch: Any, rows: int) -> Graph:
        import torch

        static_in = _like(batch, rows, self.device)
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side), torch.inference_mode(), self._autocast():
            for _ in range(2):  # warm-up: lazy initialisation must not happen inside the capture
                self.handler.forward(self.model, static_in)
        current.wait_stream(side)
        try:
            return self._capture_graph(static_in, side, timed=True)
        except (RuntimeError, TypeError):  # a torch or driver without event nodes in graphs
            torch.cuda.synchronize(self.device)
            return self._capture_graph(static_in, side, timed=False)

    def _capture_graph(self, static_in: Any, side: Any, timed: bool) -> Graph:
        import torch

        events = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(2)] if timed else []
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, stream=side), self._autocast():
            if events:
                events[0].record()
            static_out = self.handler.forward(self.model, static_in)
            if events:
                events[1].record()
        torch.cuda.synchronize(self.device)
        entry = Graph(graph, static_in, static_out, *events)
        if timed:  # prove the events time a replay before trusting them
            graph.replay()
            torch.cuda.synchronize(self.device)
            if entry.kernel_ms() is None:
                raise RuntimeError("graph timing events unusable")
        return entry
