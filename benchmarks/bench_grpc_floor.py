"""The CPU a bare ``grpc.aio`` unary server spends per request, answering with one trailer (a
request id) or two (plus a ``server-timing`` value as long as netgain's): the floor under a
netgain frontend's cost, and what the timing trailer alone costs; one trailer behind netgain's
receive deadline (``server/receive_deadline.py``): what that interceptor costs; and grpcio's
thread-pool (sync) server with one trailer, the other serving API a frontend could use.
A second trailer is measured twice: with one value for every request (HPACK sends it as an index
after the first) and with a value new every request, as a real server's is. Alternating trials;
each also reports the requests/s the one client (32 calls in flight) got.
``--instructions`` counts each server's instructions per request under valgrind's cachegrind
instead, (I(K2) - I(K1)) / (K2 - K1), so start-up cancels: a count repeats where CPU time on a
shared host does not.

    python benchmarks/bench_grpc_floor.py --trials 3 --seconds 4
    python benchmarks/bench_grpc_floor.py --instructions [--requests 1024,5120]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TIMING = (
    "queue;dur=0.001, pre;dur=0.002, h2d;dur=0.000, kernel;dur=0.004, d2h;dur=0.000, "
    "post;dur=0.000, total;dur=0.010, batch;id=5;size=32"
)


DEADLINE = 3  # one trailer, behind the ReceiveDeadline interceptor
SYNC = 4  # one trailer, grpc.server on a thread pool
VARYING = 5  # two trailers, the server-timing value new every request as netgain's is


def timings(n: int) -> list[str]:
    """``n`` server-timing values, each unlike the last, as real requests' durations are; made before
    serving, so the count holds gRPC's work, not the making of the string."""
    return [TIMING.replace("id=5", f"id={i}").replace("0.010", f"{i / 1000:.3f}") for i in range(n)]


def serve_sync() -> None:
    from concurrent import futures

    import grpc

    def handler(request: bytes, context: object) -> bytes:
        context.set_trailing_metadata((("x-request-id", "abc123"),))  # type: ignore[attr-defined]
        return b"ok"

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    rpc = grpc.unary_unary_rpc_method_handler(handler)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"M": rpc}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    signal.signal(signal.SIGINT, lambda *_: server.stop(0))  # exit whole, so cachegrind writes its file
    print(port, flush=True)
    server.wait_for_termination()


def serve(variant: int) -> None:
    import grpc

    from netgain.server.receive_deadline import ReceiveDeadline

    served = 0
    varying = timings(997)  # more than HPACK's table holds: every value goes out as a literal

    async def handler(request: bytes, context: object) -> bytes:
        nonlocal served
        served += 1
        md = [("x-request-id", "abc123")]
        if variant in (2, VARYING):
            md.append(("server-timing", TIMING if variant == 2 else varying[served % len(varying)]))
        context.set_trailing_metadata(tuple(md))  # type: ignore[attr-defined]
        return b"ok"

    async def main() -> None:
        server = grpc.aio.server(interceptors=[ReceiveDeadline(30.0)] if variant == DEADLINE else None)
        rpc = grpc.unary_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"M": rpc}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)  # a clean exit, as above
        await stop.wait()
        await server.stop(0)

    asyncio.run(main())


def measure(variant: int, seconds: float) -> tuple[float, float]:
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
            return (sum(server.cpu_times()[:2]) - cpu0) / count * 1e6, count / seconds
    finally:
        proc.kill()
        proc.wait()


def instructions(variant: int, requests: int, out_dir: str) -> int:
    """The server's instructions (cachegrind) from start to SIGINT, having answered ``requests``."""
    import grpc

    out = os.path.join(out_dir, f"cg.{variant}.{requests}")
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"]
    proc = subprocess.Popen(
        [*cmd, sys.executable, __file__, "--serve", str(variant)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONHASHSEED="0"),  # dict probing, and so the count, follows the hash
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/M")
            for _ in range(requests // 32):
                for f in [call.future(b"x", timeout=120) for _ in range(32)]:
                    f.result()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(300)
    with open(out) as fh:
        found = re.search(r"^summary:\s+(\d+)", fh.read(), re.M)
    if not found:
        raise SystemExit(f"no cachegrind summary in {out}")
    return int(found.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--instructions", action="store_true", help="count instructions under cachegrind")
    ap.add_argument("--requests", default="1024,5120", help="K1,K2 for --instructions (multiples of 32)")
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve_sync() if a.serve == SYNC else serve(a.serve)
        return 0
    names = {
        1: "1 trailer",
        2: "2 trailers",
        VARYING: "2 trailers, varying",
        DEADLINE: "1 trailer + receive deadline",
        SYNC: "sync, 1 trailer",
    }
    if a.instructions:
        k1, k2 = (int(k) for k in a.requests.split(","))
        if not 0 < k1 < k2 or k1 % 32 or k2 % 32:
            raise SystemExit(f"--requests {a.requests}: K1 < K2, both positive multiples of 32")
        with tempfile.TemporaryDirectory() as tmp:
            for variant, name in names.items():
                i1, i2 = instructions(variant, k1, tmp), instructions(variant, k2, tmp)
                print(f"{name}: {(i2 - i1) / (k2 - k1):,.0f} instructions per request", flush=True)
        return 0
    us: dict[int, list[float]] = {v: [] for v in names}
    rps: dict[int, list[float]] = {v: [] for v in names}
    for trial in range(a.trials):
        for variant in us:
            cpu, done = measure(variant, a.seconds)
            us[variant].append(cpu)
            rps[variant].append(done)
            print(
                f"trial {trial + 1}, {names[variant]}: {cpu:.1f} us of server CPU/request, {done:,.0f} req/s"
            )
    one, two, dl, sync, vary = (statistics.median(us[v]) for v in (1, 2, DEADLINE, SYNC, VARYING))
    print(f"median: one trailer {one:.1f} us, two {two:.1f} us per request ({two - one:+.1f} us)")
    print(f"median: two trailers, the second varying, {vary:.1f} us ({vary - one:+.1f} us)")
    print(f"median: one trailer behind the receive deadline {dl:.1f} us ({dl - one:+.1f} us)")
    r1, rs = statistics.median(rps[1]), statistics.median(rps[SYNC])
    print(
        f"median: sync server {sync:.1f} us ({sync - one:+.1f} us), {rs:,.0f} req/s against aio's {r1:,.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
