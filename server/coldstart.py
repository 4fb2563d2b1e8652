"""Cold-start timeline: process start → imports → model built → on device → warm-up → ready."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

COLD_START_PHASES = ("process_start", "imports", "model_built", "on_device", "warmup", "ready")


def process_create_time() -> float:
    """Unix time at which this process was created (kernel's record, via psutil)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


@dataclass
class ColdStart:
    """Phase ends as seconds since process creation; a phase's duration runs from the previous end."""

    created_unix_s: float = field(default_factory=process_create_time)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str, at_unix_s: float | None = None) -> None:
        if phase not in COLD_START_PHASES:
            raise ValueError(f"unknown cold-start phase {phase!r}")
        now = time.time() if at_unix_s is None else at_unix_s
        self.marks[phase] = max(0.0, now - self.created_unix_s)

    def timeline(self) -> list[tuple[str, float, float]]:
        """``[(phase, at_s, duration_s), ...]`` for the phases marked so far, in order."""
        out = []
        prev = 0.0
        for phase in COLD_START_PHASES:
            if phase in self.marks:
                at = self.marks[phase]
                out.append((phase, at, max(0.0, at - prev)))
                prev = at
        return out
