"""What a batch size seen for the first time while serving costs, with each warm-up policy.

The server's dynamic batcher forms any batch size from 1 to --max-batch-size. Each policy runs in a
fresh process (kernel choices and loaded modules are per process): warm up, then run every batch
size twice and report how much longer its first run took than its second.
  ends    the smallest and largest batch, --warmup-batches rounds (what the server did before)
  served  the server's own warm-up (netgain.server.bootstrap.warm_up)
Usage: python benchmarks/bench_warmup.py [--models image,resnet50] [--device cuda] [--max-batch 64]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

from common import device_ms, table

POLICIES = ("ends", "served")


def measure(model: str, device: str, max_batch: int, policy: str, threads: int) -> dict[str, object]:
    """One policy in this process: warm-up seconds and each size's first-minus-second run (ms)."""
    import torch

    from netgain.server.bootstrap import build_runners, warm_up
    from netgain.server.config import ServeConfig
    from netgain.server.handlers import create_handler

    torch.set_num_threads(threads)
    cfg = ServeConfig(model=model, device=device, max_batch_size=max_batch)
    handler = create_handler(model, {}, cfg.seed)
    (runner,) = build_runners(handler, device, cfg)
    runner.place(handler.build_model())
    items = [handler.preprocess(handler.example_input(random.Random(1))) for _ in range(max_batch)]

    def timed(size: int) -> float:
        batch = runner.prepare(handler.collate(items[:size]))
        return device_ms(lambda: runner.run(batch), runner.is_cuda)[0]

    start = time.perf_counter()
    if policy == "served":
        warm_up(handler, runner, cfg)
    else:
        for _ in range(cfg.warmup_batches):
            for size in sorted({1, max_batch}):
                timed(size)
    warm_s = time.perf_counter() - start
    extra = [timed(size) - timed(size) for size in range(1, max_batch + 1)]
    return {"warm_s": warm_s, "extra_ms": extra}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="image,resnet50")
    p.add_argument("--device", default="cuda")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=4, help="torch intra-op threads in each process")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "POLICY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], args.device, args.max_batch, args.one[1], args.threads)))
        return 0
    rows = []
    for model in args.models.split(","):
        for policy in POLICIES:
            cmd = [sys.executable, __file__, "--one", model, policy, "--device", args.device]
            cmd += ["--max-batch", str(args.max_batch), "--threads", str(args.threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            extra = r["extra_ms"]
            slow = sum(1 for e in extra if e > 5.0)
            rows.append(
                [
                    model,
                    policy,
                    f"{r['warm_s']:.2f}",
                    f"{max(extra):.1f}",
                    f"{statistics.median(extra):.2f}",
                    f"{sum(extra):.0f}",
                    f"{slow}/{len(extra)}",
                ]
            )
            print(" | ".join(str(c) for c in rows[-1]), file=sys.stderr, flush=True)  # a cut run keeps it
    print(f"device {args.device}, batch sizes 1-{args.max_batch}, {args.threads} torch threads per process")
    print(
        table(
            rows,
            [
                "model",
                "warm-up",
                "warm-up s",
                "worst first extra ms",
                "median extra ms",
                "sum extra ms",
                "sizes > 5 ms",
            ],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
