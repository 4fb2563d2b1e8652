"""torch.profiler capture for the Profile RPC (``ProfileCapture``) and the ranges-only profiler it
and ``benchmarks/bench_span_accuracy.py`` use; this module alone touches torch's private profiler APIs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any


class ProfileCapture:
    """torch.profiler over the next N batches of device worker 0, exported as a Chrome trace.

    Kineto binds its client to the thread that registered it (the main thread), so
    ``start`` and ``stop`` run there (the Profile RPC handler); ``profile_all_threads``
    lets it record the device worker's ranges too. ``ranges_only`` records the batch ranges
    and the device's activity but no operator. ``done``: no more batches are recorded;
    ``closed``: the profiler is stopped (or never started), so another capture may begin.
    """

    def __init__(self, batches: int, path: str, cuda: bool, ranges_only: bool = False) -> None:
        self.batches = batches
        self.path = path
        self.cuda = cuda
        self.ranges_only = ranges_only
        self.seen = 0
        self.batch_ids: list[int] = []
        self.started = threading.Event()
        self.done = threading.Event()
        self.closed = threading.Event()
        self.error: str = ""
        self._prof: Any = None

    def start(self) -> None:
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        try:
            from torch._C._profiler import _ExperimentalConfig

            cfg: Any = _ExperimentalConfig(profile_all_threads=True)
        except (ImportError, TypeError):
            cfg = None
        try:
            if self.ranges_only:
                self._prof = user_ranges_profiler(cuda=self.cuda, experimental_config=cfg)
            else:
                extra = {} if cfg is None else {"experimental_config": cfg}
                self._prof = torch.profiler.profile(activities=acts, record_shapes=False, **extra)
            self._prof.__enter__()
        except Exception as exc:  # e.g. a torch without the private hooks ranges_only needs
            _disable_quietly()
            self.done.set()
            self.closed.set()  # so that the next request is not refused as "already running"
            raise ProfilerUnavailable(f"torch.profiler could not start: {type(exc).__name__}: {exc}") from exc
        self.started.set()

    def stop(self) -> None:
        """Stops recording (also when called before N batches were seen) and writes the trace."""
        self.done.set()
        try:
            self._prof.__exit__(None, None, None)
            self._prof.export_chrome_trace(self.path)
        except Exception as exc:  # a profiler failure never fails a request
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.closed.set()

    def run(self, batch_id: int, fn: Callable[[], Any]) -> Any:
        import torch

        try:
            with torch.profiler.record_function(f"netgain_batch_{batch_id}"):
                return fn()
        finally:
            self.seen += 1
            self.batch_ids.append(batch_id)
            if self.seen >= self.batches:
                self.done.set()


class ProfilerUnavailable(RuntimeError):
    """torch.profiler could not be started in this process (a server-side condition)."""


def _disable_quietly() -> None:
    """Undo a start that failed half-way (Kineto prepared, or the profiler flagged as enabled)."""
    import torch.autograd.profiler as ap

    with contextlib.suppress(Exception):  # nothing was enabled: fine
        from torch._C._autograd import _disable_profiler

        _disable_profiler()
    with contextlib.suppress(Exception):
        ap._run_on_profiler_stop()


def user_ranges_profiler(cuda: bool, experimental_config: Any) -> Any:
    """An autograd profiler whose operator callbacks see only user scopes (``record_function``):
    the device's kernels and copies still come from CUPTI, but no operator is recorded (a full
    capture adds several µs of host work to every operator, delaying the launches it measures)."""
    import torch.autograd.profiler as ap
    from torch._C._autograd import _enable_profiler
    from torch._C._profiler import RecordScope

    class UserRanges(ap.profile):  # type: ignore[misc]
        def _start_trace(self) -> None:
            self.entered = True
            # The binding takes the scopes (torch's .pyi omits them): user scopes only.
            _enable_profiler(  # type: ignore[call-arg]
                self.config(create_trace_id=False), self.kineto_activities, {RecordScope.USER_SCOPE}
            )
            ap._run_on_profiler_start()  # after: a failed enable leaves nothing flagged on
            self.profiling_start_time_ns = time.perf_counter_ns()

    return UserRanges(
        use_kineto=True,
        use_cpu=True,
        use_device="cuda" if cuda else None,
        record_shapes=False,
        experimental_config=experimental_config,
    )
