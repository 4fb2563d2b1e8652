"""Phase names, the metadata keys and the ``server-timing`` trailer (W3C Server-Timing syntax, dur in
ms): the server encodes it, the load generator parses it.

Kept free of torch and grpc imports: the load generator parses trailers with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from operator import itemgetter

PHASES: tuple[str, ...] = ("queue", "pre", "h2d", "kernel", "d2h", "post")
TIMING_KEY = "server-timing"
REQUEST_ID_KEY = "x-request-id"


def encode_server_timing(durations_ns: Mapping[str, int]) -> str:
    """``{"queue": 120000, ...}`` → ``"queue;dur=0.120, ..."`` (microsecond resolution in ms)."""
    return ", ".join(f"{name};dur={ns / 1e6:.3f}" for name, ns in durations_ns.items())


# Three steps, so each value is formatted once where it becomes known and the event loop formats only
# post and total; the batch rides in this trailer because every metadata entry costs gRPC work.
_BATCH_PHASES_FORMAT = "pre;dur=%.3f, h2d;dur=%.3f, kernel;dur=%.3f, d2h;dur=%.3f"
_HEAD_FORMAT = "queue;dur=%.3f, %s"
_TAIL_FORMAT = "%s, post;dur=%.3f, total;dur=%.3f, batch;id=%d;size=%d"
_phase_values = itemgetter(*PHASES)


def phase_values(spans: Mapping[str, int]) -> Sequence[int]:
    """Durations in PHASES order; a phase a request never reached (it failed early) is 0."""
    try:
        return _phase_values(spans)  # a served request has all
    except KeyError:
        return [spans.get(phase, 0) for phase in PHASES]


def batch_phases_part(pre_ns: int, h2d_ns: int, kernel_ns: int, d2h_ns: int) -> str:
    """The phases every request of a batch shares, formatted once per batch."""
    return _BATCH_PHASES_FORMAT % (pre_ns / 1e6, h2d_ns / 1e6, kernel_ns / 1e6, d2h_ns / 1e6)


def trailer_head(queue_ns: int, batch_part: str) -> str:
    """Everything up to post: the request's queue, then its batch's phases."""
    return _HEAD_FORMAT % (queue_ns / 1e6, batch_part)


def trailer_value(head: str, post_ns: int, total_ns: int, batch_id: int, batch_size: int) -> str:
    """The finished trailer: ``head``, post, total, then ``batch;id=<id>;size=<items>`` (id -1:
    never batched). Same format as ``encode_server_timing`` plus the batch entry."""
    return _TAIL_FORMAT % (head, post_ns / 1e6, total_ns / 1e6, batch_id, batch_size)


def encode_phases(phases_ns: Sequence[int], total_ns: int, batch_id: int, batch_size: int) -> str:
    """The whole trailer in one call, for requests that never reached post-processing."""
    q, pre, h2d, kernel, d2h, post = phases_ns
    head = trailer_head(q, batch_phases_part(pre, h2d, kernel, d2h))
    return trailer_value(head, post, total_ns, batch_id, batch_size)


# The whole trailer with h2d, kernel and d2h and the batch entry given formatted (what a batch's requests
# share when each has its own pre, as with --workers): same text as encode_phases.
# Bytes: gRPC sends them as they are (a str it encodes per call), and bytes %-formatting is quicker.
_DEVICE_PHASES_FORMAT = b"h2d;dur=%.3f, kernel;dur=%.3f, d2h;dur=%.3f"
_BATCH_FORMAT = b"batch;id=%d;size=%d"
_WITH_PARTS_FORMAT = b"queue;dur=%.3f, pre;dur=%.3f, %s, post;dur=%.3f, total;dur=%.3f, %s"


class TrailerEncoder:
    """``encode_phases`` for a stream of requests, as ASCII bytes, formatting h2d, kernel and d2h,
    and the batch entry, once per run of equal values: a batch's requests are answered one after
    another and share them, and each ``%.3f`` or ``%d`` costs more than the rest of the trailer's
    making. One thread only."""

    def __init__(self) -> None:
        self._kernel = self._h2d = self._d2h = -1  # no duration is negative: the first request misses
        self._part = b""
        self._batch_id: int | None = None
        self._batch_size: int | None = None
        self._batch = b""

    def encode(self, spans: Mapping[str, int], total_ns: int, batch_id: int, batch_size: int) -> bytes:
        try:
            kernel, h2d, d2h = spans["kernel"], spans["h2d"], spans["d2h"]
            if kernel != self._kernel or h2d != self._h2d or d2h != self._d2h:
                self._part = _DEVICE_PHASES_FORMAT % (h2d / 1e6, kernel / 1e6, d2h / 1e6)
                self._kernel, self._h2d, self._d2h = kernel, h2d, d2h
            if batch_id != self._batch_id or batch_size != self._batch_size:
                self._batch = _BATCH_FORMAT % (batch_id, batch_size)
                self._batch_id, self._batch_size = batch_id, batch_size
            return _WITH_PARTS_FORMAT % (
                spans["queue"] / 1e6,
                spans["pre"] / 1e6,
                self._part,
                spans["post"] / 1e6,
                total_ns / 1e6,
                self._batch,
            )
        except KeyError:  # a request that never reached every phase
            return encode_phases(phase_values(spans), total_ns, batch_id, batch_size).encode()


def parse_server_timing(value: str) -> dict[str, float]:
    """Parse a Server-Timing header value into ``{name: dur_ms}``; entries without dur are skipped.

    Raises ValueError with the offending entry when a dur is not a number.
    """
    return parse_trailer(value)[0]


def parse_batch(value: str) -> tuple[int, int] | None:
    """The ``batch;id=12;size=8`` entry of a server-timing value → ``(12, 8)``; None when there is
    none."""
    return parse_trailer(value)[1]


# This server's own trailer as encode_phases writes it: one regex match, cheaper for the load generator's
# sender than a split per entry. Anything else takes the general path.
_OWN_TRAILER = re.compile(
    ", ".join(rf"{name};dur=(\d+\.\d+)" for name in (*PHASES, "total")) + r", batch;id=(-?\d+);size=(-?\d+)"
)
_OWN_NAMES = (*PHASES, "total")


def parse_trailer(value: str) -> tuple[dict[str, float], tuple[int, int] | None]:
    """One pass over a server-timing value: ``({name: dur_ms}, (batch id, batch size) or None)``.
    A batch field that is missing reads -1. Raises ValueError naming the entry when a dur or a
    batch field is not a number."""
    own = _OWN_TRAILER.fullmatch(value)
    if own is not None:
        g = own.groups()
        return dict(zip(_OWN_NAMES, map(float, g[:7]), strict=True)), (int(g[7]), int(g[8]))
    return parse_trailer_general(value)


def parse_trailer_general(value: str) -> tuple[dict[str, float], tuple[int, int] | None]:
    """``parse_trailer`` for any Server-Timing value (other servers', hand-written ones)."""
    durations: dict[str, float] = {}
    batch: tuple[int, int] | None = None
    for entry in value.split(","):
        parts = [p.strip() for p in entry.split(";")]
        name = parts[0]
        if not name:
            continue
        params = {k.strip(): v for k, _, v in (p.partition("=") for p in parts[1:])}
        try:
            if "dur" in params:
                durations[name] = float(params["dur"].strip().strip('"'))
            elif name == "batch":
                batch = int(params.get("id", -1)), int(params.get("size", -1))
        except ValueError:
            raise ValueError(f"server-timing entry {entry.strip()!r}: not a number") from None
    return durations, batch
