"""KServe v2 REST (``--http-port``) beside gRPC on one ``netgain serve --model null``: one client at
a time, one kept-alive connection each, the same 64-byte item, trials alternating between REST
with JSON tensors, REST with binary tensors and netgain.v1 over gRPC. Per trial: round trip p50
and p99 as the client sees it, the server's own total (the ``server-timing`` value) p50, outside =
round trip - server total (the network and both sides' HTTP or gRPC work) p50, and the server
process's CPU per request (user + system, all its threads, from /proc through psutil).
``--max-queue-delay-ms 0``: no batching wait, so the protocols' own costs are what differs.

    python benchmarks/bench_rest.py --requests 3000 --trials 3
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import table

ITEM = b"x" * 64
WARMUP = 300


def start_server(ports_file: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "netgain.cli", "serve", "--model", "null", "--workers", "0", "--port", "0",
        "--metrics-port", "-1", "--http-port", "0", "--max-queue-delay-ms", "0", "--ports-file", ports_file,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.monotonic() + 120
    while not os.path.exists(ports_file):
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(
                f"the server did not start: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
        time.sleep(0.05)
    time.sleep(3.0)  # health SERVING: the null model warms up in well under this
    return proc


def rest_sender(port: int, binary: bool) -> Callable[[int], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    tensor: dict[str, object] = {"name": "INPUT", "datatype": "BYTES", "shape": [1]}
    headers = {"Content-Type": "application/json"}
    if binary:
        raw = len(ITEM).to_bytes(4, "little") + ITEM
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
        body = head + raw
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
        }
    else:
        tensor["data"] = [ITEM.decode()]
        body = json.dumps({"inputs": [tensor]}).encode()

    def send(i: int) -> str:
        conn.request("POST", "/v2/models/null/infer", body, {**headers, "x-request-id": f"r{i}"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        return str(resp.getheader("server-timing"))

    return send


def grpc_sender(port: int) -> Callable[[int], str]:
    import grpc

    from netgain.protos import InferenceStub, pb

    stub = InferenceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    request = pb.InferRequest(inputs=[pb.Input(data=ITEM)])

    def send(i: int) -> str:
        _, call = stub.Infer.with_call(request, metadata=(("x-request-id", f"g{i}"),))
        return str(dict(call.trailing_metadata())["server-timing"])

    return send


def trial(send: Callable[[int], str], n: int, server: object) -> dict[str, float]:
    from netgain.contract.phases import parse_trailer

    for i in range(WARMUP):
        send(i)
    trips, totals = [], []
    cpu0 = server.cpu_times()  # type: ignore[attr-defined]
    for i in range(n):
        t = time.perf_counter()
        timing = send(i)
        trips.append((time.perf_counter() - t) * 1e3)
        totals.append(parse_trailer(timing)[0]["total"])
    cpu1 = server.cpu_times()  # type: ignore[attr-defined]
    trips_sorted = sorted(trips)
    return {
        "p50": statistics.median(trips),
        "p99": trips_sorted[int(0.99 * (n - 1))],
        "server": statistics.median(totals),
        "outside": statistics.median(a - b for a, b in zip(trips, totals, strict=True)),
        "cpu_us": ((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / n * 1e6,
    }


def main() -> None:
    import psutil

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="measured requests per trial")
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ports_file = os.path.join(tmp, "ports.json")
        proc = start_server(ports_file)
        try:
            with open(ports_file) as fh:
                ports = json.load(fh)
            server = psutil.Process(ports["pid"])
            senders = {
                "REST json": rest_sender(ports["http"], binary=False),
                "REST binary": rest_sender(ports["http"], binary=True),
                "gRPC v1": grpc_sender(ports["grpc"]),
            }
            results: dict[str, list[dict[str, float]]] = {name: [] for name in senders}
            for t in range(args.trials):
                order = list(senders) if t % 2 == 0 else list(reversed(senders))
                for name in order:
                    results[name].append(trial(senders[name], args.requests, server))
        finally:
            proc.terminate()
            proc.wait(30)
    rows: list[list[object]] = []
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        cells = [med["p50"], med["p99"], med["server"], med["outside"]]
        rows.append([name, *(f"{v:.3f}" for v in cells), f"{med['cpu_us']:.0f}"])
    usable = len(os.sched_getaffinity(0))
    print(f"host: {os.cpu_count()} cores, {usable} usable; medians of {args.trials} trials")
    header = ["protocol", "p50 ms", "p99 ms", "server p50 ms", "outside p50 ms", "server CPU us/req"]
    print(table(rows, header))


if __name__ == "__main__":
    main()
