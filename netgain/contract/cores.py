"""Core lists as the server and the load generator print them (taskset's notation)."""

from __future__ import annotations

from collections.abc import Sequence


def cpu_list(cpus: Sequence[int]) -> str:
    """Core numbers as taskset writes them: 0-3,8."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
