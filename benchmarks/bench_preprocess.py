"""Pre-processing rate of a handler's options side by side: one single-threaded process per
core, all at once (the pre-processing ceiling of bench_ceiling.py), alternating the options over
several trials so drift on a shared host falls on both.

    python benchmarks/bench_preprocess.py --model image --option resize=pil --option resize=torch
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_ceiling import pre_ceiling
from benchmarks.common import table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="image")
    ap.add_argument("--option", action="append", default=[], help="KEY=VALUE compared against the others")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args(argv)
    options = a.option or [""]
    cores = sorted(os.sched_getaffinity(0))
    rates: dict[str, list[tuple[float, float]]] = {o: [] for o in options}
    for trial in range(a.trials):
        for o in options:
            opts = dict([o.split("=", 1)]) if o else {}
            one = pre_ceiling(a.model, opts, cores[:1], a.seconds)
            every = pre_ceiling(a.model, opts, cores, a.seconds)
            rates[o].append((one, every))
            name = o or "defaults"
            line = f"trial {trial + 1} {name}: {one:,.0f}/s on 1 core, {every:,.0f}/s on {len(cores)}"
            print(line, flush=True)
    rows = []
    for o in options:
        ones = sorted(r[0] for r in rates[o])
        everys = sorted(r[1] for r in rates[o])
        rows.append([o or "defaults", f"{ones[len(ones) // 2]:,.0f}", f"{everys[len(everys) // 2]:,.0f}",
                     f"{1e3 / ones[len(ones) // 2]:.2f}"])  # fmt: skip
    print(table(rows, ["option", "items/s, 1 core (median)", f"items/s, {len(cores)} cores", "ms per item"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
