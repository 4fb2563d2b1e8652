"""Cold-start timeline: process start → imports → model built → on device → warm-up → ready."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from netgain.server.procstat import CLK_TCK, STARTTIME, stat_fields

COLD_START_PHASES = ("process_start", "imports", "model_built", "on_device", "warmup", "ready")


def _linux_create_time() -> float | None:
    """Creation time from /proc/self/stat's starttime (clock ticks since boot, CLOCK_BOOTTIME)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        start_ticks = int(stat_fields("/proc/self/stat")[STARTTIME])
        boot_s = time.clock_gettime(time.CLOCK_BOOTTIME)
        now_unix_s = time.time()
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    # The age is measured on the kernel's own clock, then placed on the Unix clock the marks use.
    return now_unix_s - (boot_s - start_ticks / CLK_TCK)


def process_create_time() -> float:
    """Unix time at which this process was created.

    Not psutil's ``create_time()`` on Linux: it adds the start ticks to /proc/stat's ``btime``,
    which is whole seconds, so it comes out up to 1 s early and inflates every phase end by
    that much. Here the process's age comes from the same boot-time clock as its start ticks
    (10 ms resolution, rounded down, so never later than the true creation).
    """
    created = _linux_create_time()
    if created is not None:
        return created
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
