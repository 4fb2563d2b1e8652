"""The fields of a Linux ``/proc/PID[/task/TID]/stat`` line, read the one safe way.

The command name (field 2, in parentheses) may hold spaces, ")" and bytes that are not UTF-8,
so the line is read as bytes and split after its last ")". Indexes below count from field 3.
"""

from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # the unit of the times
UTIME, STIME, STARTTIME = 11, 12, 19  # fields 14, 15 and 22 of proc(5)


def stat_fields(path: str) -> list[bytes]:
    """The fields after the command name (``int()`` takes them as they are). Raises OSError."""
    with open(path, "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()
