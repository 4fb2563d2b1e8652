"""Which asyncio event loop a serving process runs: uvloop's where installed (``--event-loop
auto``), or the standard library's.

gRPC's asyncio server takes any loop; uvloop runs its callbacks and timers in compiled code, where
asyncio's ``_run_once`` and selector are Python (docs/benchmarks.md: about a quarter fewer
instructions per request in a frontend).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

KINDS = ("auto", "asyncio", "uvloop")


def loop_factory(kind: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """(the loop's name, its factory; None: asyncio's own). ValueError for ``uvloop`` when it is not
    installed or for an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"--event-loop {kind!r}: use one of {', '.join(KINDS)}")
    if kind == "asyncio":
        return "asyncio", None
    try:
        import uvloop
    except ImportError:
        if kind == "uvloop":
            raise ValueError("--event-loop uvloop: uvloop is not installed (pip install uvloop)") from None
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def describe(kind: str) -> str:
    """The loop ``kind`` runs, with its version: ``uvloop 0.23.0`` or ``asyncio``."""
    name, _ = loop_factory(kind)
    if name == "uvloop":
        import uvloop

        return f"uvloop {uvloop.__version__}"
    return name


def run(main: Coroutine[Any, Any, T], kind: str) -> T:
    """``asyncio.run(main)`` on the loop ``kind`` names."""
    import asyncio  # here, not at the top: the command line reads KINDS and need not load asyncio

    _, factory = loop_factory(kind)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
