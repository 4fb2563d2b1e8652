"""OS-visible thread names, so CPU per thread role can be read from /proc (and seen in top -H).

Python before 3.14 keeps ``threading.Thread(name=...)`` to itself: every thread's ``comm``
is the process name, and the sampler could not tell the pre-processing pool from torch's
compute threads. Linux limits the name to 15 bytes, so ``netgain-`` becomes ``ng-``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
import threading

_PR_SET_NAME = 15
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        _libc = None


def os_thread_name(name: str) -> str:
    return name.replace("netgain-", "ng-")[:15]


def name_os_thread(name: str | None = None) -> None:
    """Name the calling thread for the OS (default: its Python name). Never raises."""
    if _libc is None:
        return
    with contextlib.suppress(Exception):  # a name is a convenience, never a failure
        _libc.prctl(_PR_SET_NAME, os_thread_name(name or threading.current_thread().name).encode(), 0, 0, 0)
