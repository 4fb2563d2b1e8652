"""Instrumentation cost in instructions per request, counted by valgrind's cachegrind.

Throughput on a shared host moves by +-5 % between trials of one setting, more than the effect
being looked for; instruction counts do not. The null-model server runs under cachegrind with
instrumentation on and off, twice each (K1 and K2 requests at concurrency 64, full batches of
32), and (I(K2) - I(K1)) / (K2 - K1) is its cost per request with start-up and shutdown cancelled.
The recorder drains every 2 s here, as it would hold a few hundred requests per drain at full
speed; BLAS threads are held to one, as their spinning depends on timing, not on requests.

An instruction count leaves out what instrumentation costs in contention (the GIL, caches) and on
the client, so it bounds the server's own work, not the throughput lost: the side-by-side
benchmark (bench_overhead.py) measures that.

Usage: python benchmarks/bench_instructions.py [--requests 1000,5000] [--out DIR]
Needs valgrind; about 2-3 minutes per server on a 2-core machine.
Where the difference goes: cg_diff DIR/cg.off.K2 DIR/cg.on.K2 > d; cg_annotate d | head -60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from common import table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER_ARGS = [
    "--model", "null", "--port", "0", "--metrics-port", "-1", "--max-batch-size", "32",
    "--max-queue-delay-ms", "100", "--intra-op-threads", "1", "--sample-interval-s", "30",
    "--recorder-interval-s", "2",
]  # fmt: skip


async def _drive(port: int, count: int, concurrency: int) -> None:
    import grpc

    from netgain.loadgen.payloads import PayloadFactory
    from netgain.protos.service import SERVICE_NAME

    body = PayloadFactory("null", {}).request_bytes(0, 0, 1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = channel.unary_unary(f"/{SERVICE_NAME}/Infer")
        deadline = time.monotonic() + 600
        while True:  # warming up under valgrind takes a while: UNAVAILABLE until SERVING
            try:
                await infer(body, timeout=60)
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)
        left = count

        async def user(k: int) -> None:
            nonlocal left
            i = 0
            while left > 0:
                left -= 1
                i += 1
                await infer(body, metadata=(("x-request-id", f"c{k}-{i}"),), timeout=120)

        await asyncio.gather(*(user(k) for k in range(concurrency)))


def count_instructions(instrumented: bool, requests: int, out_dir: str, concurrency: int) -> int:
    tag = f"{'on' if instrumented else 'off'}.{requests}"
    ports = os.path.join(out_dir, f"ports.{tag}.json")
    cg_out = os.path.join(out_dir, f"cg.{tag}")
    cmd = [
        "valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={cg_out}",
        sys.executable, "-m", "netgain.server", *SERVER_ARGS, "--ports-file", ports,
    ]  # fmt: skip
    if not instrumented:
        cmd.append("--no-instrumentation")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    log_path = os.path.join(out_dir, f"valgrind.{tag}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 600
            while not os.path.exists(ports):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"server under valgrind did not start; see {log_path}")
                time.sleep(0.5)
            time.sleep(0.2)  # the file is written in one go, but give the writer a moment
            with open(ports) as fh:
                port = int(json.load(fh)["grpc"])
            asyncio.run(_drive(port, requests, concurrency))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(600)
    with open(cg_out) as fh:
        summary = [line for line in fh if line.startswith("summary:")]
    if not summary:
        raise SystemExit(f"no cachegrind summary in {cg_out}")
    return int(summary[-1].split()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", default="1000,5000", help="K1,K2: requests per run")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out", default="", help="keep cachegrind's files here (default: a temp dir)")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    k1, k2 = (int(x) for x in a.requests.split(","))
    if not 0 < k1 < k2:
        raise SystemExit("--requests K1,K2 needs 0 < K1 < K2")
    out_dir = a.out or tempfile.mkdtemp(prefix="netgain-cg-")
    os.makedirs(out_dir, exist_ok=True)
    per_request: dict[bool, float] = {}
    for instrumented in (False, True):
        counts = []
        for k in (k1, k2):
            counts.append(count_instructions(instrumented, k, out_dir, a.concurrency))
            print(f"{'on' if instrumented else 'off'} {k} requests: {counts[-1]:,} instructions", flush=True)
        per_request[instrumented] = (counts[1] - counts[0]) / (k2 - k1)
    off, on = per_request[False], per_request[True]
    print(
        table(
            [[f"{off:,.0f}", f"{on:,.0f}", f"{on - off:+,.0f}", f"{(on / off - 1) * 100:+.1f} %"]],
            ["off: instructions/request", "on", "added", "added share"],
        )
    )
    print(f"cachegrind files in {out_dir}")


if __name__ == "__main__":
    main()
