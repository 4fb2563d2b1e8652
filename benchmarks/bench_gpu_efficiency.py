"""GPU efficiency: server items/s at saturation vs an offline loop of the same handler, batch and dtype.

The offline loop runs the handler's whole path serially in one thread (pre-process the
batch, collate, pin, copy, forward, copy back, post-process) with nothing else around it;
the server adds gRPC, batching and threads, and overlaps pre-processing with device work.
Target (issue 2, H200): server >= 85 % of offline, image and text.
Usage: python benchmarks/bench_gpu_efficiency.py --device cuda [--batch 64] [--dtype bfloat16] [--servers 1,2]
(--servers N: N server processes sharing one port and the GPU, as a deployment whose one process
is frontend-bound would run them)
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time

from common import run_clients, shared_port_servers, table

from netgain.experiments.orchestrate import free_port
from netgain.server.device import DeviceRunner
from netgain.server.handlers import create_handler

OPTIONS = {"image": ["size=224"], "text": ["pad=fixed"], "tabular": []}


def offline(model: str, device: str, dtype: str, batch: int, seconds: float) -> float:
    opts = dict(o.split("=", 1) for o in OPTIONS[model])
    h = create_handler(model, opts)
    runner = DeviceRunner(h, device, dtype)
    runner.place(h.build_model())
    rng = random.Random(0)
    inputs = [h.example_input(rng) for _ in range(batch)]

    def once() -> None:
        items = [h.preprocess(x) for x in inputs]
        out = runner.run(runner.prepare(h.collate(items))).output
        [h.postprocess(out[i]) for i in range(batch)]

    for _ in range(5):
        once()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        once()
        n += batch
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--models", default="image,text")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--pre-threads", type=int, default=8)
    ap.add_argument("--items", default="1,8", help="items per request to try (1 measures the frontend too)")
    ap.add_argument("--servers", default="1", help="server process counts to try, comma-separated")
    a = ap.parse_args()
    rows = []
    for model in a.models.split(","):
        off = offline(model, a.device, a.dtype, a.batch, a.duration)
        args = [
            "--model",
            model,
            "--device",
            a.device,
            "--dtype",
            a.dtype,
            "--max-batch-size",
            str(a.batch),
            "--max-queue-delay-ms",
            "5",
            "--max-queue-size",
            "4096",
            "--pre-threads",
            str(a.pre_threads),
        ]
        for o in OPTIONS[model]:
            args += ["--handler-option", o]
        for items in (int(k) for k in a.items.split(",")):
            for n in (int(k) for k in a.servers.split(",")):
                with contextlib.ExitStack() as stack:
                    res = run_clients(
                        shared_port_servers(stack, n, args, free_port()),
                        model,
                        processes=a.client_procs,
                        concurrency=max(2, 2 * a.batch // items),
                        items=items,
                        duration=a.duration,
                        options=OPTIONS[model],
                    )
                rows.append(
                    [
                        model,
                        a.dtype,
                        a.batch,
                        items,
                        n,
                        round(off),
                        round(res.items_per_s),
                        f"{res.items_per_s / off * 100:.1f} %",
                        res.errors,
                    ]
                )
    print(
        table(
            rows,
            [
                "model",
                "dtype",
                "batch",
                "items/request",
                "servers",
                "offline items/s",
                "server items/s",
                "server/offline",
                "errors",
            ],
        )
    )


if __name__ == "__main__":
    main()
