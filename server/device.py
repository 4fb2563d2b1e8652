"""Run one batch on a device, timed per phase.

On CUDA the h2d, kernel and d2h spans come from CUDA events recorded on the
instance's own stream and read after the batch's single synchronisation; on the
CPU the kernel span is the wall time of the forward pass and the copies are 0.
A handler with ``host_inputs`` makes its own copies inside ``forward``: its h2d span
is 0 and the kernel span holds them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from netgain.server.handlers.base import Handler, PartialOutput


class DeviceOutOfMemory(RuntimeError):
    """A single item did not fit on the device even alone: RESOURCE_EXHAUSTED."""


@dataclass
class DeviceResult:
    output: Any
    h2d_ns: int
    kernel_ns: int
    d2h_ns: int
    splits: int = 0
    invalid: dict[int, str] = field(default_factory=dict)  # row -> message: bad input found by forward


def tree_map(fn: Callable[[Any], Any], batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and batch and not isinstance(batch[0], (int, float, bytes)):
        return type(batch)(tree_map(fn, v) for v in batch)
    return fn(batch)


def _rows(batch: Any, start: int, end: int) -> Any:
    return tree_map(lambda t: t[start:end], batch)


def _unwrap(out: Any) -> tuple[Any, dict[int, str]]:
    """forward's output and the rows it found invalid (a PartialOutput carries both)."""
    if isinstance(out, PartialOutput):
        return out.output, out.invalid
    return out, {}


def batch_rows(batch: Any) -> int:
    if isinstance(batch, dict):
        return batch_rows(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)):
        return len(batch)
    return int(batch.shape[0])


def _has_conv(model: Any) -> bool:
    """A torch module with a 2-d convolution in it (None, or a handler's non-module model: False)."""
    import torch

    return isinstance(model, torch.nn.Module) and any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def resolve_device(name: str) -> str:
    """``cpu`` | ``cuda`` | ``cuda:N`` | ``auto`` → a concrete device string, or ValueError saying why."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"--device {name}: CUDA is not available on this host (use --device cpu or auto)"
            )
        index, count = name.partition(":")[2], torch.cuda.device_count()
        if index and (not index.isdigit() or int(index) >= count):
            raise ValueError(
                f"--device {name}: no such GPU, this host has {count} (cuda:0..cuda:{count - 1})"
            )
        return name
    if name != "cpu":
        raise ValueError(f"--device {name!r}: use cpu, cuda, cuda:N or auto")
    return name


DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


class DeviceRunner:
    """One model instance on one device (one CUDA stream per instance)."""

    def __init__(
        self,
        handler: Handler,
        device: str,
        dtype: str = "float32",
        nvtx: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        import torch

        self.handler = handler
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.dtype = DTYPES[dtype]
        self.nvtx = nvtx and self.is_cuda
        self.model: Any = None
        self.stream: Any = None
        self._autocast = self.dtype != "float32" and handler.uses_device
        # Graphs need fixed shapes; a handler that pads to the longest item in a batch cannot use them,
        # nor one whose forward copies host inputs itself (a graph replays no host-side work).
        self.cuda_graphs = (
            cuda_graphs
            and self.is_cuda
            and handler.uses_device
            and handler.fixed_shapes
            and not handler.host_inputs
        )
        self.graphs: Any = None
        self._events: list[Any] = []  # the four timing events, made once (see place)

    def place(self, model: Any) -> None:
        """Move a built model to this runner's device and give it a stream (CUDA)."""
        import torch

        self.model = model.to(self.device) if model is not None else None
        if not self.is_cuda and _has_conv(self.model):
            # oneDNN's CPU convolutions run batches faster with channels-last weights (docs/benchmarks.md)
            self.model = self.model.to(memory_format=torch.channels_last)
        if self.is_cuda:
            self.stream = torch.cuda.Stream(self.device)
            # Made and recorded once, then reused (one batch at a time): torch creates an event at its
            # first record, which would otherwise run inside the kernel span with the GPU idle.
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            with torch.cuda.stream(self.stream):
                for event in self._events:
                    event.record()
            torch.cuda.synchronize(self.device)
        if self.cuda_graphs:
            from netgain.server.cudagraphs import GraphCache

            dtype = getattr(torch, self.dtype) if self._autocast else None
            self.graphs = GraphCache(self.handler, self.model, self.device, dtype)

    def prepare(self, batch: Any) -> Any:
        """Host-side staging done on a pre-processing thread: pinned memory for async copies."""
        if self.is_cuda and self.handler.uses_device and not self.handler.host_inputs:
            return tree_map(lambda t: t.pin_memory(), batch)
        return batch

    @contextlib.contextmanager
    def _range(self, name: str) -> Iterator[None]:
        if self.nvtx:
            import torch

            torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()
        else:
            yield

    def _autocast_ctx(self) -> Any:
        import torch

        if not self._autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.dtype))

    def run(self, batch: Any) -> DeviceResult:
        import torch

        if not self.handler.uses_device:
            t0 = time.perf_counter_ns()
            out, invalid = _unwrap(self.handler.forward(self.model, batch))
            return DeviceResult(out, 0, time.perf_counter_ns() - t0, 0, invalid=invalid)
        try:
            return self._run_cuda(batch) if self.is_cuda else self._run_cpu(batch)
        except torch.OutOfMemoryError:
            return self._split_after_oom(batch)

    def _run_cpu(self, batch: Any) -> DeviceResult:
        import torch

        t0 = time.perf_counter_ns()
        with torch.inference_mode(), self._autocast_ctx():
            out, invalid = _unwrap(self.handler.forward(self.model, batch))
        out = out.float() if out.dtype != torch.float32 else out
        return DeviceResult(out, 0, time.perf_counter_ns() - t0, 0, invalid=invalid)

    def _run_cuda(self, batch: Any) -> DeviceResult:
        import torch

        events = self._events
        invalid: dict[int, str] = {}
        with torch.cuda.stream(self.stream), torch.inference_mode():
            events[0].record(self.stream)
            if self.graphs is not None:
                rows = batch_rows(batch)
                with self._range("h2d"):
                    entry = self.graphs.stage(batch, rows)
                events[1].record(self.stream)
                with self._range("kernel"):
                    out = self.graphs.replay(entry, rows)
            else:
                with self._range("h2d"):
                    if self.handler.host_inputs:  # forward copies them itself: its copies are kernel time
                        dev = batch
                    else:
                        dev = tree_map(lambda t: t.to(self.device, non_blocking=True), batch)
                events[1].record(self.stream)
                with self._range("kernel"), self._autocast_ctx():
                    out, invalid = _unwrap(self.handler.forward(self.model, dev))
            events[2].record(self.stream)
            with self._range("d2h"):
                host = torch.empty(out.shape, dtype=torch.float32, pin_memory=True)
                host.copy_(out, non_blocking=True)
            events[3].record(self.stream)
        events[3].synchronize()
        ms = [events[i].elapsed_time(events[i + 1]) for i in range(3)]
        if self.handler.host_inputs:  # no copy of ours between the first two events: all kernel
            ms = [0.0, ms[0] + ms[1], ms[2]]
        inner = entry.kernel_ms() if self.graphs is not None else None
        if inner is not None:
            # The graph's own events: the time it waited to be launched is not kernel time (the
            # pipeline charges it to queue with the rest of the device stage's waits).
            ms[1] = min(ms[1], inner)
        return DeviceResult(host, int(ms[0] * 1e6), int(ms[1] * 1e6), int(ms[2] * 1e6), invalid=invalid)

    def _split_after_oom(self, batch: Any) -> DeviceResult:
        import torch

        if self.is_cuda:
            torch.cuda.empty_cache()
        rows = batch_rows(batch)
        if rows <= 1:
            raise DeviceOutOfMemory("device out of memory on a single item") from None
        half = rows // 2
        # A host-inputs batch is a list of items: slice the list, not each item.
        cut = (lambda a, b: batch[a:b]) if self.handler.host_inputs else (lambda a, b: _rows(batch, a, b))
        parts = [self.run(cut(a, b)) for a, b in ((0, half), (half, rows))]
        return DeviceResult(
            torch.cat([p.output for p in parts]),
            sum(p.h2d_ns for p in parts),
            sum(p.kernel_ns for p in parts),
            sum(p.d2h_ns for p in parts),
            splits=1 + sum(p.splits for p in parts),
            invalid={**parts[0].invalid, **{half + i: m for i, m in parts[1].invalid.items()}},
        )
