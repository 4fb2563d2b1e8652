"""CPU forward time per batch with the weights as built (channels-first) or channels-last, as the
server's DeviceRunner places a convolutional model on the CPU.

Both layouts run the same batches alternately in one process (median of --reps each), with the
torch threads set explicitly; the outputs are checked to agree.
Usage: python benchmarks/bench_cpu_layout.py [--models image,resnet50] [--batches 1,4,16,64]
       [--threads 2] [--reps 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from common import table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="image,resnet50")
    p.add_argument("--batches", default="1,4,16,64")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    import torch

    from netgain.server.device import DeviceRunner
    from netgain.server.handlers import create_handler

    torch.set_num_threads(args.threads)
    rows = []
    for model in args.models.split(","):
        handler = create_handler(model, {}, 0)
        placed = DeviceRunner(handler, "cpu")
        placed.place(handler.build_model())
        built = handler.build_model().eval()  # the same seeded weights, left channels-first
        sizes = [int(b) for b in args.batches.split(",")]
        rng = random.Random(0)
        items = [handler.preprocess(handler.example_input(rng)) for _ in range(max(sizes))]
        for size in sizes:
            batch = handler.collate(items[:size])
            times: dict[str, list[float]] = {"first": [], "last": []}
            with torch.inference_mode():
                diff = float((placed.run(batch).output - handler.forward(built, batch)).abs().max())
                for _ in range(args.reps):
                    start = time.perf_counter()
                    handler.forward(built, batch)
                    times["first"].append((time.perf_counter() - start) * 1e3)
                    start = time.perf_counter()
                    placed.run(batch)
                    times["last"].append((time.perf_counter() - start) * 1e3)
            first, last = statistics.median(times["first"]), statistics.median(times["last"])
            rows.append([model, size, f"{first:.1f}", f"{last:.1f}", f"{first / last:.2f}x", f"{diff:.1e}"])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
    print(f"cpu, {args.threads} torch threads, median of {args.reps} runs each, alternating")
    print(table(rows, ["model", "batch", "channels-first ms", "channels-last ms", "speed-up", "max |diff|"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
