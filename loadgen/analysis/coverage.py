"""What the report cannot attribute for a run whose server sent no netgain trailers.

`netgain load --protocol oip` drives any Open Inference Protocol server (Triton, KServe, MLServer).
Only `netgain serve` answers with the `server-timing` trailer and serves netgain's /metrics and
ServerInfo, so against another server the client's latency stays whole: the report says so, once
per attribution it cannot make, instead of showing blanks that look like zeros.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def attribution_gaps(server_total_ok: np.ndarray, meta: dict[str, Any]) -> list[str]:
    """One line per attribution the run cannot support ([] when every successful request carried
    the trailer). ``server_total_ok``: the trailer's total per successful measured request, NaN
    where it was missing."""
    n = len(server_total_ok)
    missing = int(np.isnan(server_total_ok).sum()) if n else 0
    cfg = meta.get("config") or {}
    oip = cfg.get("protocol") == "oip"
    if n == 0 or (missing == 0 and not oip):
        return []
    platform = ((meta.get("server") or {}).get("versions") or {}).get("platform")
    who = f"{cfg.get('protocol') or 'netgain'} target" + (f" (platform {platform})" if platform else "")
    lines: list[str] = []
    if missing:
        lines += [
            f"no server-timing trailer on {missing} of {n} successful requests from the {who}: for them "
            "the report cannot split server time into queue, pre, h2d, kernel, d2h and post, nor separate "
            "network from server time (the tail's dominant phase and the phase table cover only "
            "requests that carried the trailer)",
            "batch sizes are unknown without the trailer (batch;id=..;size=..): no batch-size mean, and "
            "the span log cannot be joined by batch",
        ]
    if oip:
        lines.append(
            "an Open Inference Protocol run reads no ServerInfo and scrapes no netgain /metrics: device, "
            "cold start, GPU and per-thread CPU utilisation are unknown, so the bottleneck kind cannot "
            "be named (measure the server with its own metrics; against netgain serve, --protocol netgain)"
        )
    return lines
