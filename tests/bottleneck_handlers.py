"""Handlers built to have one bottleneck each, for the real-server bottleneck tests
(imported by server processes as ``bottleneck_handlers:BusyPre`` with tests/ on PYTHONPATH)."""

from __future__ import annotations

import random
import time
from typing import Any

from netgain.protos import pb
from netgain.server.handlers.base import Handler


class BusyPre(Handler):
    """Interpreter-bound: pre-processing is a pure-Python busy loop of ``pre_ms`` of this thread's
    CPU time per item (it holds the GIL while it runs, so more pre threads share one core; CPU time,
    not wall time, so the work per item stays the same when threads wait for the GIL); the forward
    pass is free."""

    name = "busy-pre"
    uses_device = False

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.pre_ms = self.int_option("pre_ms", 10, lo=0)

    def build_model(self) -> Any:
        return None

    def preprocess(self, item: pb.Input) -> Any:
        end = time.thread_time() + self.pre_ms / 1000
        n = 0
        while time.thread_time() < end:
            n += 1
        return len(item.data)

    def collate(self, items: list[Any]) -> Any:
        return list(items)

    def forward(self, model: Any, batch: Any) -> Any:
        return batch

    def postprocess(self, row: Any) -> pb.Output:
        return pb.Output(label=int(row))

    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        return pb.Input(data=b"x" * (size or 8))


class HeavyForward(BusyPre):
    """Device-bound on a CPU: no sleep, the forward pass multiplies ``rounds`` 256x256 matrices per
    batch in torch (the GIL released, like a real model's compute); pre-processing is free."""

    name = "heavy-forward"

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.pre_ms = 0
        self.rounds = self.int_option("rounds", 40, lo=1)

    def build_model(self) -> Any:
        import torch

        return torch.randn(256, 256)

    def forward(self, model: Any, batch: Any) -> Any:
        import torch

        x = model
        for _ in range(self.rounds * len(batch)):
            x = torch.tanh(x @ model)
        return batch


class SlowTagged(BusyPre):
    """Pre-processing sleeps ``sleep_ms`` for an item whose data starts with ``slow`` (and costs
    nothing otherwise, so start-up and warm-up stay fast): a request held mid-pre-processing.
    With ``mark_dir``, each such item first creates a file there named after the process's pid,
    so a test sees which processes hold one."""

    name = "slow-tagged"

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.pre_ms = 0
        self.sleep_ms = self.int_option("sleep_ms", 2000, lo=0)
        self.mark_dir = self.options.get("mark_dir", "")

    def preprocess(self, item: pb.Input) -> Any:
        if item.data.startswith(b"slow"):
            if self.mark_dir:
                import os
                from pathlib import Path

                Path(self.mark_dir, f"{os.getpid()}-{time.monotonic_ns()}").touch()
            time.sleep(self.sleep_ms / 1000)
        return len(item.data)


class PidPre(BusyPre):
    """Pre-processing answers with the id of the process that ran it (the label), so a test sees
    which process pre-processed each request; ``pre_ms`` of busy CPU as in ``BusyPre``."""

    name = "pid-pre"

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.pre_ms = self.int_option("pre_ms", 0, lo=0)

    def preprocess(self, item: pb.Input) -> Any:
        import os

        super().preprocess(item)
        return os.getpid()


class SleepPre(BusyPre):
    """Pre-processing waits ``sleep_ms`` per item without using the CPU: a side of known capacity
    (pre threads x 1000 / sleep_ms req/s) that leaves the host's cores to the load generator."""

    name = "sleep-pre"

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.pre_ms = 0
        self.sleep_ms = self.int_option("sleep_ms", 50, lo=0)

    def preprocess(self, item: pb.Input) -> Any:
        time.sleep(self.sleep_ms / 1000)
        return len(item.data)
