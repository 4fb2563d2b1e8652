"""OS-visible thread names, so CPU per thread role can be read from /proc (and seen in top -H).

Python before 3.14 keeps ``threading.Thread(name=...)`` to itself: every thread's ``comm``
is the process name, and the sampler could not tell the pre-processing pool from torch's
compute threads. Linux limits the name to 15 bytes, so ``netgain-`` becomes ``ng-``.

A name alone does not identify a thread: a thread started by one of ours (torch's OpenMP
workers, started by the device thread at its first parallel op) inherits its OS name. So each
named thread is also recorded by native id (with its start time, as ids are reused), and the
sampler classifies by id first (``own_threads``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
import threading

from netgain.server.procstat import STARTTIME, stat_fields

_PR_SET_NAME = 15
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        _libc = None


def os_thread_name(name: str) -> str:
    return name.replace("netgain-", "ng-")[:15]


def _start_ticks(tid: int) -> int | None:
    """The thread's start time (/proc starttime, clock ticks since boot); None without /proc."""
    try:
        return int(stat_fields(f"/proc/self/task/{tid}/stat")[STARTTIME])
    except (OSError, ValueError, IndexError):
        return None


# native thread id -> (OS name, start ticks): the server's own named threads.
_own: dict[int, tuple[str, int | None]] = {}
_own_lock = threading.Lock()


def own_threads() -> dict[int, tuple[str, int | None]]:
    """A copy of the threads named by ``name_os_thread``: native id → (OS name, start ticks)."""
    with _own_lock:
        return dict(_own)


def name_os_thread(name: str | None = None) -> None:
    """Name the calling thread for the OS (default: its Python name) and record it. Never raises."""
    with contextlib.suppress(Exception):  # a name is a convenience, never a failure
        os_name = os_thread_name(name or threading.current_thread().name)
        tid = threading.get_native_id()
        start = _start_ticks(tid)
        with _own_lock:
            _own[tid] = (os_name, start)
        if _libc is not None:
            _libc.prctl(_PR_SET_NAME, os_name.encode(), 0, 0, 0)
