"""Speed and precision of the capacity search (netgain/experiments/capacity.py).

Simulated (default): sides of known capacity whose runs hold when the offered rate is at most the
capacity times a seeded noise factor (a run's p99 is noisy near saturation); for each start rate and
precision, the runs the search made and how far its bracket is from the true capacity.

``--real``: one ``netgain compare`` of two CPU sides of known capacity (one pre-processing thread
waiting ``--sleep-ms`` per request, from tests/bottleneck_handlers.py), its wall time, runs per side
and the brackets found against the ceiling ``1000 / sleep_ms`` req/s.

    python benchmarks/bench_search.py
    PYTHONPATH=tests:. python benchmarks/bench_search.py --real --sleep-ms 50 [--batch-sizes 1,4,16,64]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from netgain.experiments.capacity import Trial, search


def simulated(seed: int, trials: int) -> None:
    rng = random.Random(seed)
    print(
        "| start / capacity | precision | runs median (max) | bracket width median | |error| median (max) |"
    )
    print("|---|---|---|---|---|")
    for ratio in (0.01, 0.3, 1.0, 3.0, 30.0):
        for precision in (0.25, 0.1, 0.05):
            runs, widths, errors = [], [], []
            for _ in range(trials):
                cap = 10 ** rng.uniform(1, 4)

                def run(rate: float, cap: float = cap) -> Trial:
                    held = rate <= cap * rng.uniform(0.95, 1.05)
                    return Trial(rate, min(rate, cap), 1.0, 50.0 if held else 500.0, 0, 0.0, True, "", held)

                c = search(run, cap * ratio, floor=1.0, ceiling=1e6, precision=precision).capacity
                assert c.last_held is not None and c.first_missed is not None
                runs.append(c.runs)
                widths.append((c.first_missed - c.last_held) / c.last_held)
                errors.append(abs((c.capacity_rps or 0.0) - cap) / cap)
            print(
                f"| {ratio:g} | {precision:.0%} | {statistics.median(runs):.0f} ({max(runs)}) | "
                f"{statistics.median(widths):.1%} | {statistics.median(errors):.1%} ({max(errors):.1%}) |"
            )


def real(sleep_ms: int, duration: float, precision: float, batch_sizes: str) -> None:
    out = Path(tempfile.mkdtemp(prefix="bench-search-"))
    cmd = [
        sys.executable, "-m", "netgain.cli", "compare", "--model", "bottleneck_handlers:SleepPre",
        "--handler-option", f"sleep_ms={sleep_ms}", "--baseline-serve-args", "--pre-threads 1",
        "--treatment-serve-args", "--pre-threads 1", "--treatment-device", "cpu",
        "--batch-sizes", batch_sizes, "--duration", f"{duration:g}", "--warmup-s", "0.5",
        "--sweep-duration", f"{duration:g}",
        "--precision", f"{precision:g}", "--min-rps", "2", "--slo-p99-ms", "200",
        "--cpu-price-per-hour", "1", "--gpu-price-per-hour", "2", "--out", str(out),
    ]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        sys.exit(f"compare failed: {res.stderr[-2000:]}")
    expected = next((ln for ln in res.stderr.splitlines() if "expect ~" in ln), "")
    rep = json.loads((out / "compare-warm" / "report.json").read_text())
    measured = sum(1 for p in out.rglob("meta.json") if "invalid" not in p.parts)
    print(
        f"wall {wall:.0f} s; {measured} runs measured; ceiling {1000 / sleep_ms:g} req/s; "
        f"{expected.split(': ', 1)[-1]}"
    )
    for side, c in rep["compare"]["capacity"].items():
        print(
            f"{side}: {c['runs']} runs, capacity {c['capacity_rps']} req/s, last held {c['last_held']}, "
            f"first missed {c['first_missed']}"
        )
    print(f"verdict {rep['verdict']['outcome']}; {rep['crossover']['outcome']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--sleep-ms", type=int, default=50)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--precision", type=float, default=0.1)
    ap.add_argument("--batch-sizes", default="1", help="compare's --batch-sizes in the --real run")
    args = ap.parse_args()
    if args.real:
        real(args.sleep_ms, args.duration, args.precision, args.batch_sizes)
    else:
        simulated(args.seed, args.trials)


if __name__ == "__main__":
    main()
