"""What the sender engine sends with: a ``Sender`` per protocol (gRPC: ``grpc_sender``; HTTP:
``http_sender``), and what any of them makes of an answer's ``server-timing``.

The engine owns the schedule, the timing and the records; a sender builds each request's message
before the run, hands one over when the engine says so, and reports how it ended.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from netgain.contract.messages import Plan
from netgain.contract.phases import PHASES, parse_trailer
from netgain.contract.records import PHASE_COLUMNS, SERVER_COLUMNS

#: The record columns a sender fills from an answer: the server's, the HTTP status and the reason.
ANSWER_COLUMNS: tuple[str, ...] = (*SERVER_COLUMNS, "http_status", "error")
NO_ANSWER: dict[str, Any] = dict.fromkeys(ANSWER_COLUMNS)
_TIMING_COLUMNS = tuple(zip((*PHASES, "total"), (*PHASE_COLUMNS, "server_total_ms"), strict=True))
MAX_REASON = 200  # characters of a failure's reason kept in its record

#: How a request ended: (status code, response bytes, answer columns).
Outcome = tuple[str, int, dict[str, Any]]


def server_columns(value: str | None) -> dict[str, Any]:
    """Server phases, total and batch from a ``server-timing`` value (a gRPC trailer or an HTTP
    header: netgain's own, or any W3C Server-Timing that uses the phase names); missing values are
    None, and so is all of it when the value does not parse."""
    out = dict(NO_ANSWER)
    if not value:
        return out
    try:
        timing, batch = parse_trailer(value)
    except ValueError:
        return out
    for name, column in _TIMING_COLUMNS:
        out[column] = timing.get(name)
    if batch is not None and batch[0] >= 0:
        out["batch_id"], out["batch_size"] = batch
    return out


def one_line(text: str) -> str:
    """A failure's reason for its record: one line of at most ``MAX_REASON`` characters, its start
    and its end when longer (a traceback's last line says what failed)."""
    line = " ".join(text.split())
    if len(line) <= MAX_REASON:
        return line
    half = (MAX_REASON - 5) // 2
    return f"{line[:half]} ... {line[-half:]}"


class Sender(Protocol):
    def build(self, index: np.ndarray, size: np.ndarray, items: np.ndarray) -> list[Any]:
        """The message of each request (pre-serialized, before the run)."""
        ...

    def size(self, message: Any) -> int:
        """A message's request bytes, for its record."""
        ...

    async def open(self) -> None:
        """Connect, before the first request is due."""
        ...

    def start(self, message: Any, idx: int, target: int) -> Any:
        """Hand request ``idx`` to target ``target`` now; returns what ``finish`` awaits."""
        ...

    async def finish(self, pending: Any) -> Outcome:
        """How the request ended; ``CANCELLED`` when ``cancel`` ended it."""
        ...

    def cancel(self) -> None:
        """End every request in flight (a stop's drain ran out)."""
        ...

    async def close(self) -> None: ...


def make_sender(plan: Plan) -> Sender:
    """The sender of ``plan.protocol``; each imports only its own client."""
    from netgain.loadgen.http_requests import HTTP_PROTOCOLS

    if plan.protocol in HTTP_PROTOCOLS:
        from netgain.loadgen.runner.http_sender import HttpSender

        return HttpSender(plan)
    from netgain.loadgen.runner.grpc_sender import GrpcSender

    return GrpcSender(plan)
