"""The CPU a bare ``grpc.aio`` unary server spends per request, answering with one trailer (a
request id) or two (plus a ``server-timing`` value as long as netgain's): the floor under a
netgain frontend's cost, and what the timing trailer alone costs; and one trailer behind
netgain's receive deadline (``server/receive_deadline.py``): what that interceptor costs.
Alternating trials.

    python benchmarks/bench_grpc_floor.py --trials 3 --seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

TIMING = (
    "queue;dur=0.001, pre;dur=0.002, h2d;dur=0.000, kernel;dur=0.004, d2h;dur=0.000, "
    "post;dur=0.000, total;dur=0.010, batch;id=5;size=32"
)


DEADLINE = 3  # one trailer, behind the ReceiveDeadline interceptor


def serve(variant: int) -> None:
    import grpc

    from netgain.server.receive_deadline import ReceiveDeadline

    trailers = 1 if variant == DEADLINE else variant

    async def handler(request: bytes, context: object) -> bytes:
        md = [("x-request-id", "abc123")] + ([("server-timing", TIMING)] if trailers == 2 else [])
        context.set_trailing_metadata(tuple(md))  # type: ignore[attr-defined]
        return b"ok"

    async def main() -> None:
        server = grpc.aio.server(interceptors=[ReceiveDeadline(30.0)] if variant == DEADLINE else None)
        rpc = grpc.unary_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"M": rpc}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def measure(variant: int, seconds: float) -> float:
    import grpc
    import psutil

    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(variant)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/M")
            for _ in range(200):
                call(b"x")
            server = psutil.Process(proc.pid)
            cpu0, count, end = sum(server.cpu_times()[:2]), 0, time.monotonic() + seconds
            while time.monotonic() < end:
                for f in [call.future(b"x") for _ in range(32)]:
                    f.result()
                count += 32
            return (sum(server.cpu_times()[:2]) - cpu0) / count * 1e6
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve)
        return 0
    us: dict[int, list[float]] = {1: [], 2: [], DEADLINE: []}
    names = {1: "1 trailer", 2: "2 trailers", DEADLINE: "1 trailer + receive deadline"}
    for trial in range(a.trials):
        for variant in us:
            us[variant].append(measure(variant, a.seconds))
            print(f"trial {trial + 1}, {names[variant]}: {us[variant][-1]:.1f} us of server CPU/request")
    one, two, dl = (statistics.median(us[v]) for v in (1, 2, DEADLINE))
    print(f"median: one trailer {one:.1f} us, two {two:.1f} us per request ({two - one:+.1f} us)")
    print(f"median: one trailer behind the receive deadline {dl:.1f} us ({dl - one:+.1f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
