"""Phase names and the ``server-timing`` trailer (W3C Server-Timing syntax, dur in ms).

Kept free of torch and grpc imports: the load generator parses trailers with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter

PHASES: tuple[str, ...] = ("queue", "pre", "h2d", "kernel", "d2h", "post")
TIMING_KEY = "server-timing"
BATCH_KEY = "x-batch"
REQUEST_ID_KEY = "x-request-id"


def encode_server_timing(durations_ns: Mapping[str, int]) -> str:
    """``{"queue": 120000, ...}`` → ``"queue;dur=0.120, ..."`` (microsecond resolution in ms)."""
    return ", ".join(f"{name};dur={ns / 1e6:.3f}" for name, ns in durations_ns.items())


# One %-format with seven floats: a third of the cost of formatting each entry (~2 vs ~7 µs),
# paid on every response (issue 2's instrumentation-overhead budget).
_TRAILER_FORMAT = ", ".join(f"{name};dur=%.3f" for name in (*PHASES, "total"))
_phase_values = itemgetter(*PHASES)


def phase_values(spans: Mapping[str, int]) -> Sequence[int]:
    """Durations in PHASES order; a phase a request never reached (it failed early) is 0."""
    try:
        return _phase_values(spans)  # a served request has all
    except KeyError:
        return [spans.get(phase, 0) for phase in PHASES]


def encode_phases(phases_ns: Sequence[int], total_ns: int) -> str:
    """The trailer for a finished request: every phase in PHASES order, then total; same format
    as ``encode_server_timing``."""
    q, pre, h2d, kernel, d2h, post = phases_ns
    return _TRAILER_FORMAT % (
        q / 1e6,
        pre / 1e6,
        h2d / 1e6,
        kernel / 1e6,
        d2h / 1e6,
        post / 1e6,
        total_ns / 1e6,
    )


def parse_server_timing(value: str) -> dict[str, float]:
    """Parse a Server-Timing header value into ``{name: dur_ms}``; entries without dur are skipped.

    Raises ValueError with the offending entry when a dur is not a number.
    """
    out: dict[str, float] = {}
    for entry in value.split(","):
        parts = [p.strip() for p in entry.split(";")]
        name = parts[0]
        if not name:
            continue
        for param in parts[1:]:
            key, _, raw = param.partition("=")
            if key.strip() == "dur":
                try:
                    out[name] = float(raw.strip().strip('"'))
                except ValueError:
                    raise ValueError(f"server-timing entry {entry.strip()!r}: dur is not a number") from None
    return out


def encode_batch(batch_id: int, batch_size: int) -> str:
    return f"id={batch_id};size={batch_size}"


def parse_batch(value: str) -> tuple[int, int]:
    """``"id=12;size=8"`` → ``(12, 8)``; missing fields are -1."""
    fields = dict(p.partition("=")[::2] for p in value.split(";"))
    try:
        return int(fields.get("id", -1)), int(fields.get("size", -1))
    except ValueError:
        raise ValueError(f"x-batch value {value!r} is not id=<int>;size=<int>") from None
