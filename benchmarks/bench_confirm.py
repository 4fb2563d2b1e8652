"""Check the bottleneck `netgain compare` named for one side by removing it.

Reads OUT/compare-warm/report.json: the side's limit (`compare.limits`: the first sweep rate past
the SLO and the kind found there) and its sweep. Picks the lever that removes that kind for this
model (or takes --lever), then runs the same server configuration with and without the lever at
the last rate that held, between, and the first that missed, on the same cores as compare's
sweep. Confirmed when the lever holds the SLO at a rate the configuration without it missed.

    python benchmarks/bench_confirm.py OUT --model image --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from netgain.analysis import build_report
from netgain.experiments.orchestrate import ServerProcess, choose_placement, run_load

# kind -> lever that takes that resource out of the way, per model family.
LEVERS = {
    ("image", "gpu-bound"): "--dtype bfloat16",
    ("text", "gpu-bound"): "--dtype bfloat16",
    ("image", "cpu"): "--handler-option resize=torch",
    ("text", "cpu"): "--cuda-graphs",
}


def lever_for(model: str, kind: str) -> str:
    family = "image" if model == "image" else "text"
    return LEVERS[(family, "gpu-bound" if kind == "gpu-bound" else "cpu")]


def rates_around(rates: list[float], sweep_held: list[bool]) -> list[float]:
    """The last rate that held, the midpoint, and the first that missed."""
    missed = [r for r, ok in zip(rates, sweep_held, strict=True) if not ok]
    if not missed:
        raise SystemExit("every sweep rate held the SLO: nothing to confirm (raise compare's --rates)")
    hi = missed[0]
    held = [r for r, ok in zip(rates, sweep_held, strict=True) if ok and r < hi]
    lo = held[-1] if held else hi / 2
    return [lo, round((lo + hi) / 2), hi]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="a netgain compare output directory")
    ap.add_argument("--side", default="treatment")
    ap.add_argument("--model", default="image")
    ap.add_argument("--handler-option", action="append", default=[])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=0, help="max batch size (default: the one compare swept)")
    ap.add_argument("--lever", default=None, help="serve flags that remove the bottleneck (default: by kind)")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--slo-p99-ms", type=float, default=100.0)
    ap.add_argument("--connections", type=int, default=16)
    a = ap.parse_args()

    with open(os.path.join(a.out, "compare-warm", "report.json")) as fh:
        rep = json.load(fh)
    limit = next(x for x in rep["compare"]["limits"] if x["side"] == a.side)
    kind = limit["kinds"][-1]["kind"]  # the server's kind comes after a generator's
    sweep = rep["crossover"]
    rates = [float(r) for r in sweep["rates_rps"]]
    a.batch = a.batch or int(sweep[a.side]["batch_size"])
    held = [r in limit["held_rates"] for r in rates]
    lever = a.lever or lever_for(a.model, kind)
    ladder = rates_around(rates, held)
    place = choose_placement()
    workers = place.load_workers()
    print(f"{a.side}: compare named {kind} at {limit['rate']:g} req/s; lever: {lever}; rates {ladder}")
    print(place.describe_load(workers, a.connections))
    base = ["--model", a.model, "--device", a.device, "--max-batch-size", str(a.batch)]
    for opt in a.handler_option:
        base += ["--handler-option", opt]
    rows = []
    for label, extra in (("as compared", []), (f"with {lever}", shlex.split(lever))):
        root = os.path.join(a.out, "confirm", "lever" if extra else "base")
        os.makedirs(root, exist_ok=True)
        with ServerProcess(base + extra, log_path=os.path.join(root, "server.log"), cpus=place.server) as sp:
            sp.wait_ready()
            for r in ladder:
                d = os.path.join(root, f"r{r:g}")
                args = ["--target", sp.target, "--rate", f"{r:g}", "--duration", str(a.duration)]
                args += ["--warmup-s", "2", "--workers", str(workers), "--connections", str(a.connections)]
                args += ["--slo-p99-ms", str(a.slo_p99_ms), "--out", d, "--quiet"]
                run_load(args, cpus=place.load)
                s = build_report(d, slo_p99_ms=a.slo_p99_ms, bootstrap=0)
                p99 = s["latency_ms"]["p99"]
                ok = bool(s["valid"]) and p99 is not None and p99 <= a.slo_p99_ms
                rows.append((label, r, s["throughput_rps"], p99, s["bottleneck"]["kind"], ok, s["valid"]))
                print(f"  {label} at {r:g} req/s: p99 {p99} ms, {s['bottleneck']['kind']}", file=sys.stderr)
    print("\n| server | offered/s | done/s | p99 ms | bottleneck | SLO held |\n|---|---|---|---|---|---|")
    for label, r, thr, p99, k, ok, valid in rows:
        p = f"{p99:.1f}" if p99 is not None else "-"
        k = k if valid else f"{k} (INVALID)"
        print(f"| {label} | {r:g} | {thr:.0f} | {p} | {k} | {'yes' if ok else 'no'} |")
    base_held = {r for label, r, *_, ok, _v in rows if label == "as compared" and ok}
    gained = [r for label, r, *_, ok, _v in rows if label != "as compared" and ok and r not in base_held]
    verdict = "CONFIRMED" if gained else "NOT CONFIRMED"
    print(
        f"\n{verdict}: {kind} limited the {a.side}"
        + (
            f"; with {lever} it held {', '.join(f'{r:g}' for r in gained)} req/s, which it missed without"
            if gained
            else f"; {lever} held no rate the configuration without it missed"
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
