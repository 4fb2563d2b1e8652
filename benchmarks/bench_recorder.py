"""The instrumentation's Python-side cost per request, in a loop: what a frontend of ``netgain serve
--workers`` does for each answered request when instrumentation is on (``Recorder.request_done`` on
the event loop, the drain thread's histogram work, the ``server-timing`` trailer's text), on one
thread, CPU time. gRPC's own cost of sending the trailer is not in it (bench_grpc_floor.py, and the
on/off comparison of bench_overhead.py, measure the whole).

Usage: python benchmarks/bench_recorder.py [--requests 200000] [--drain-every 400] [--trials 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from prometheus_client import CollectorRegistry

from netgain.contract.phases import TrailerEncoder
from netgain.server.batching.queue import Pending
from netgain.server.telemetry.metrics import ServerMetrics
from netgain.server.telemetry.recorder import Recorder


def requests(n: int, rng: random.Random, batch: int = 32) -> list[Pending]:
    out = []
    for i in range(n):
        p = Pending(f"req-{i}", [], 0)
        p.spans.update(
            queue=rng.randint(100_000, 10_000_000), pre=rng.randint(500, 3_000_000), h2d=2_000,
            kernel=300_000 + (i // batch), d2h=1_000, post=rng.randint(5_000, 50_000),
        )  # fmt: skip
        p.batch_id, p.batch_size = i // batch, batch
        out.append(p)
    return out


def trial(reqs: list[Pending], drain_every: int) -> tuple[float, float]:
    """(recorder us, trailer us) per request: request_done with a drain every ``drain_every``
    requests (the drain thread's interval at ~8,000 requests/s), then each request's trailer."""
    recorder = Recorder(ServerMetrics(CollectorRegistry(), "null", "cuda"), None, per_request_phases=True)
    encoder = TrailerEncoder()
    t0 = time.process_time()
    for k in range(0, len(reqs), drain_every):
        for p in reqs[k : k + drain_every]:
            recorder.request_done(p, 5_000_000)
        recorder._drain()
    t1 = time.process_time()
    for p in reqs:
        encoder.encode(p.spans, 5_000_000, p.batch_id, p.batch_size)
    t2 = time.process_time()
    n = len(reqs)
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--drain-every", type=int, default=400)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    reqs = requests(a.requests, random.Random(a.seed))
    runs = [trial(reqs, a.drain_every) for _ in range(a.trials)]
    rec = statistics.median(r[0] for r in runs)
    trailer = statistics.median(r[1] for r in runs)
    print(f"trials {a.trials} x {a.requests} requests, drain every {a.drain_every}: medians")
    print(
        f"recorder (request_done + drain) {rec:.2f} us | trailer {trailer:.2f} us | "
        f"sum {rec + trailer:.2f} us per request"
    )


if __name__ == "__main__":
    main()
