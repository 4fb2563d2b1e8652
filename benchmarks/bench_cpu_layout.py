"""Forward time per batch with convolution weights channels-first (as built) or channels-last.

The server's DeviceRunner places a model with 2-d convolutions channels-last on the CPU and as
built on CUDA; this measures both layouts on either device. Both run the same batches alternately
in one process (median of --reps each), torch threads set explicitly, outputs checked to agree.
Usage: python benchmarks/bench_cpu_layout.py [--device cpu|cuda] [--models image,resnet50]
       [--batches 1,4,16,64] [--threads 2] [--reps 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
from typing import Any

from common import device_ms, table


def timed(handler: Any, model: Any, batch: Any, cuda: bool) -> tuple[float, Any]:
    return device_ms(lambda: handler.forward(model, batch), cuda)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--models", default="image,resnet50")
    p.add_argument("--batches", default="1,4,16,64")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    import torch

    from netgain.server.handlers import create_handler

    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    rows = []
    for name in args.models.split(","):
        handler = create_handler(name, {}, 0)
        first = handler.build_model().eval().to(args.device)
        last = handler.build_model().eval().to(args.device).to(memory_format=torch.channels_last)
        sizes = [int(b) for b in args.batches.split(",")]
        rng = random.Random(0)
        items = [handler.preprocess(handler.example_input(rng)) for _ in range(max(sizes))]
        for size in sizes:
            batch = handler.collate(items[:size])
            batch = batch.to(args.device) if cuda else batch
            times: dict[str, list[float]] = {"first": [], "last": []}
            with torch.inference_mode():
                diff = float(
                    (timed(handler, first, batch, cuda)[1] - timed(handler, last, batch, cuda)[1]).abs().max()
                )
                for _ in range(args.reps):
                    times["first"].append(timed(handler, first, batch, cuda)[0])
                    times["last"].append(timed(handler, last, batch, cuda)[0])
            a, b = statistics.median(times["first"]), statistics.median(times["last"])
            rows.append([name, size, f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}x", f"{diff:.1e}"])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
    served = "channels-last" if not cuda else "channels-first (as built)"
    print(f"{args.device}, {args.threads} torch threads, median of {args.reps} runs each, alternating; "
          f"the server uses {served} here")  # fmt: skip
    print(table(rows, ["model", "batch", "channels-first ms", "channels-last ms", "speed-up", "max |diff|"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
