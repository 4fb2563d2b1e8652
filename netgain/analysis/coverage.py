"""What the report cannot attribute for a run whose server sent no netgain trailers.

`netgain load --protocol oip` (and `oip-http`) drives any Open Inference Protocol server (Triton,
KServe, MLServer), `--protocol http-json` any HTTP endpoint. Only `netgain serve` serves netgain's
/metrics and ServerInfo, and only a server that sends `server-timing` (netgain's trailer, or an HTTP
`Server-Timing` header with netgain's phase names) splits its time, so otherwise the client's
latency stays whole: the report says so, once per attribution it cannot make, instead of showing
blanks that look like zeros.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def server_measured(meta: dict[str, Any]) -> bool:
    """Whether the run read the target's netgain ServerInfo and scraped its netgain /metrics: only
    with ``--protocol netgain``; after an Open Inference Protocol run (``oip``, ``oip-http``) or an
    ``http-json`` one, the server's configuration, device, queue and CPU are unknown to the report."""
    return (meta.get("config") or {}).get("protocol") in (None, "netgain")


def attribution_gaps(
    server_total_ok: np.ndarray, meta: dict[str, Any], server_total_answered: np.ndarray | None = None
) -> list[str]:
    """One line per attribution the run cannot support ([] when every successful request carried
    the trailer). ``server_total_ok``: the trailer's total per successful measured request, NaN
    where it was missing; ``server_total_answered``: the same for every answered measured request,
    whatever its status (read when none succeeded)."""
    n = len(server_total_ok)
    missing = int(np.isnan(server_total_ok).sum()) if n else 0
    answered = np.empty(0) if server_total_answered is None else server_total_answered
    timed = int((~np.isnan(answered)).sum())
    return gaps_from_counts(n, missing, len(answered), timed, meta)


def gaps_from_counts(n: int, missing: int, answered: int, timed: int, meta: dict[str, Any]) -> list[str]:
    """``attribution_gaps`` from counts: ``n`` successful requests, ``missing`` of them without the
    trailer, ``answered`` requests of any status, ``timed`` of those with it."""
    # No success: the gap stays said when no answered request carried the trailer either.
    untimed = n == 0 and answered > 0 and timed == 0
    cfg = meta.get("config") or {}
    oip = not server_measured(meta)
    platform = ((meta.get("server") or {}).get("versions") or {}).get("platform")
    who = f"{cfg.get('protocol') or 'netgain'} target" + (f" (platform {platform})" if platform else "")
    lines: list[str] = []
    if missing or untimed:
        which = (
            f"on {missing} of {n} successful requests"
            if n
            else f"on any of the {answered} answered requests (none succeeded)"
        )
        lines += [
            f"no server-timing trailer {which} from the {who}: for them "
            "the report cannot split server time into queue, pre, h2d, kernel, d2h and post, nor separate "
            "network from server time (the tail's dominant phase and the phase table cover only "
            "requests that carried the trailer)",
            "batch sizes are unknown without the trailer (batch;id=..;size=..): no batch-size mean, and "
            "the span log cannot be joined by batch",
        ]
    if oip:
        kind = "an HTTP JSON" if cfg.get("protocol") == "http-json" else "an Open Inference Protocol"
        lines.append(
            f"{kind} run reads no ServerInfo and scrapes no netgain /metrics: the "
            "server's configuration (processes, batching), device, cold start, GPU and server CPU "
            "utilisation are unknown, so the server's bottleneck kind cannot be named (measure the "
            "server with its own metrics; against netgain serve, --protocol netgain)"
        )
    return lines
