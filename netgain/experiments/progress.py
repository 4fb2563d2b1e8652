"""Progress lines for a long experiment (compare): one per run, on stderr, with the elapsed time."""

from __future__ import annotations

import sys
import time


class Progress:
    """``[done/total elapsed]`` lines on stderr; ``~total`` while the search's run count is an estimate."""

    def __init__(self, total: int, estimate: bool = False) -> None:
        self.total = total
        self.estimate = estimate
        self.done = 0
        self.started = time.monotonic()

    def step(self, label: str) -> None:
        self.done += 1
        self.total = max(self.total, self.done)
        elapsed = time.monotonic() - self.started
        total = f"~{self.total}" if self.estimate else str(self.total)
        print(f"[{self.done}/{total} {elapsed:6.0f}s] {label}", file=sys.stderr, flush=True)

    def note(self, label: str) -> None:
        """A line between steps (a step repeated), not counted as one."""
        elapsed = time.monotonic() - self.started
        total = f"~{self.total}" if self.estimate else str(self.total)
        print(f"[{self.done}/{total} {elapsed:6.0f}s] {label}", file=sys.stderr, flush=True)
