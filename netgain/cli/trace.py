"""``netgain trace``: make, import, inspect, fit and rescale traffic traces (see docs/traces.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from netgain.cli.args import CliError, flag

# The parser is built without pyarrow (a bare install): the names and the default are repeated
# from netgain.loadgen.traces.public, and tests/test_traces_public.py checks that they agree.
PUBLIC_FORMATS = ("azure-llm-2023", "azure-llm-2024", "azure-functions-2019", "mooncake", "burstgpt")
BYTES_PER_TOKEN = 4.0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``trace`` and its actions on an argparse subparsers object."""
    p = sub.add_parser(
        "trace",
        help="make, import, inspect, fit and rescale traffic traces",
        description="Traffic traces: arrival offsets (s), payload sizes (bytes) and items "
        "per request, as CSV, JSON lines or Parquet. See docs/traces.md.",
    )
    p.set_defaults(func=lambda args: _usage(p))
    acts = p.add_subparsers(dest="trace_command", metavar="ACTION")

    s = acts.add_parser("synth", help="synthesize a seeded trace from flags or from a fit")
    flag(s, "--arrival", default="poisson", help="constant, poisson, gamma, onoff or diurnal")
    flag(s, "--rate", type=float, help="mean requests per second")
    flag(s, "--duration", type=float, required=True, help="seconds of traffic")
    flag(s, "--seed", type=int, default=0, help="random seed: same flags and seed, same trace")
    flag(s, "--cv", type=float, default=2.0, help="gamma: coefficient of variation of inter-arrivals")
    flag(s, "--on-s", type=float, default=1.0, help="onoff: seconds on")
    flag(s, "--off-s", type=float, default=4.0, help="onoff: seconds off")
    flag(s, "--period-s", type=float, default=60.0, help="diurnal: period in seconds")
    flag(s, "--amplitude", type=float, default=0.5, help="diurnal: relative amplitude, 0..1")
    flag(
        s,
        "--size-bytes",
        type=int,
        default=0,
        help="payload bytes (median when --size-sigma > 0); 0 = model default",
    )
    flag(s, "--size-sigma", type=float, default=0.0, help="lognormal sigma of payload sizes")
    flag(s, "--items", default="1", help="items per request: N, or a distribution such as 1:0.7,4:0.2,16:0.1")
    flag(
        s,
        "--from-fit",
        help="JSON written by `trace fit --json`: take the model, sizes and items from it "
        "(flags given explicitly are ignored except --rate, --duration and --seed)",
    )
    flag(s, "--model", default="best", help="with --from-fit: best, poisson, gamma, diurnal or onoff")
    flag(s, "--out", required=True, help="trace file to write (.csv, .jsonl, .parquet)")
    s.set_defaults(func=cmd_synth)

    i = acts.add_parser(
        "import",
        help="make a trace from an access log (CSV/TSV or JSON lines) or a public trace (--format)",
    )
    i.add_argument("log", help="access log file, or a public trace's file with --format")
    _format_flag(i)
    flag(i, "--time-column", help="access log: column (JSON: field, nested as a.b) holding the request time")
    flag(i, "--size-column", help="access log: column holding the payload size in bytes")
    flag(i, "--items-column", help="access log: column holding items per request")
    flag(i, "--time-format", help="access log: auto, s, ms, us, ns, iso, or a strptime pattern; default auto")
    flag(
        i,
        "--bytes-per-token",
        type=float,
        help=f"token traces: payload bytes per input token (0 = the model's default size); "
        f"default {BYTES_PER_TOKEN:g}",
    )
    flag(
        i,
        "--spread",
        choices=["uniform", "even"],
        help="azure-functions-2019: place each minute's invocations uniformly at random (seeded) "
        "or evenly; default uniform",
    )
    flag(i, "--seed", type=int, help="azure-functions-2019 --spread uniform: random seed; default 0")
    flag(i, "--trigger", help="azure-functions-2019: only these trigger groups, e.g. http,queue")
    flag(i, "--out", required=True, help="trace file to write (.csv, .jsonl, .parquet)")
    i.set_defaults(func=cmd_import)

    n = acts.add_parser("inspect", help="summarise a trace: rates, burstiness, distributions")
    n.add_argument("file", help="trace file")
    flag(n, "--bin-s", type=float, default=1.0, help="seconds per rate bin")
    flag(n, "--svg", help="also write a plot to this SVG file")
    flag(n, "--json", action="store_true", help="print JSON instead of text")
    n.set_defaults(func=cmd_inspect)

    f = acts.add_parser("fit", help="fit poisson, gamma, diurnal and on/off arrival models")
    f.add_argument("file", help="trace file")
    flag(f, "--json", action="store_true", help="print JSON instead of text")
    f.set_defaults(func=cmd_fit)

    r = acts.add_parser("rescale", help="change the rate and/or duration, keeping the shape")
    r.add_argument("file", help="trace file")
    flag(r, "--rate", type=float, help="target mean requests per second")
    flag(r, "--duration", type=float, help="target seconds (cut, or loop the trace)")
    flag(r, "--out", required=True, help="trace file to write")
    r.set_defaults(func=cmd_rescale)
    return p


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return 2


def _wrote(path: str, trace: Any) -> None:
    print(
        f"wrote {path}: {len(trace):,} requests over {trace.duration_s:.3f} s "
        f"({trace.mean_rate:.2f} req/s), sha256 {trace.digest()[:16]}"
    )


def cmd_synth(args: argparse.Namespace) -> int:
    from netgain.loadgen.traces import params_from_fit, synthesize, write_trace

    if args.from_fit:
        try:
            result = json.loads(Path(args.from_fit).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CliError(f"cannot read the fit {args.from_fit!r}: {exc}") from None
        params = params_from_fit(result, args.model)
        if args.rate is not None:
            params["rate"] = args.rate
    else:
        if args.rate is None:
            raise CliError("--rate is required (or --from-fit FIT.json)")
        params = {
            "arrival": args.arrival,
            "rate": args.rate,
            "cv": args.cv,
            "on_s": args.on_s,
            "off_s": args.off_s,
            "period_s": args.period_s,
            "amplitude": args.amplitude,
            "size_bytes": args.size_bytes,
            "size_sigma": args.size_sigma,
            "items": int(args.items) if args.items.strip().isdigit() else args.items,
        }
    trace = synthesize(duration_s=args.duration, seed=args.seed, **params)
    write_trace(trace, args.out)
    _wrote(args.out, trace)
    return 0


def _format_flag(p: argparse.ArgumentParser) -> None:
    """``--format NAME``: read from NETGAIN_TRACE_IMPORT_FORMAT, not NETGAIN_FORMAT (which is
    `report --format`'s: one variable, one meaning)."""
    env = "NETGAIN_TRACE_IMPORT_FORMAT"
    names = ", ".join(PUBLIC_FORMATS)
    p.add_argument(
        "--format",
        default=os.environ.get(env),
        choices=list(PUBLIC_FORMATS),
        metavar="NAME",
        help=f"a public production trace by name: {names} (docs/traces.md) [env {env}]",
    )


ACCESS_LOG_FLAGS = ("time_column", "size_column", "items_column", "time_format")
FUNCTIONS_FLAGS = ("spread", "seed", "trigger")


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) is not None]


def cmd_import(args: argparse.Namespace) -> int:
    from netgain.loadgen.traces import import_access_log, write_trace

    if args.format:
        return _import_public(args)
    given = _given(args, ("bytes_per_token", *FUNCTIONS_FLAGS))
    if given:
        raise CliError(f"{given[0]} is for a public trace: give --format NAME ({', '.join(PUBLIC_FORMATS)})")
    if not args.time_column:
        raise CliError(
            "give --time-column C (an access log) or --format NAME (a public trace: "
            f"{', '.join(PUBLIC_FORMATS)})"
        )
    trace = import_access_log(
        args.log,
        time_column=args.time_column,
        size_column=args.size_column,
        items_column=args.items_column,
        time_format=args.time_format or "auto",
    )
    if not len(trace):
        raise CliError(f"{args.log}: the log has no requests")
    write_trace(trace, args.out)
    _wrote(args.out, trace)
    return 0


def _import_public(args: argparse.Namespace) -> int:
    from netgain.loadgen.traces import import_public, write_trace
    from netgain.loadgen.traces.public import TOKEN_FORMATS

    given = _given(args, ACCESS_LOG_FLAGS)
    if given:
        raise CliError(f"{given[0]} is for an access log; --format {args.format} reads its own columns")
    wrong = (
        _given(args, FUNCTIONS_FLAGS) if args.format in TOKEN_FORMATS else _given(args, ("bytes_per_token",))
    )
    if wrong:
        raise CliError(f"{wrong[0]} does not apply to --format {args.format}")
    triggers = [t.strip() for t in (args.trigger or "").split(",") if t.strip()]
    imported = import_public(
        args.log,
        args.format,
        bytes_per_token=BYTES_PER_TOKEN if args.bytes_per_token is None else args.bytes_per_token,
        spread=args.spread or "uniform",
        seed=0 if args.seed is None else args.seed,
        triggers=triggers or None,
    )
    if not len(imported.trace):
        raise CliError(f"{args.log}: the trace has no requests")
    write_trace(imported.trace, args.out, imported.extra)
    print(imported.note)
    _wrote(args.out, imported.trace)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from netgain.loadgen.traces import inspect_trace, read_trace
    from netgain.loadgen.traces.render import summary_text, svg_plot

    trace = read_trace(args.file)
    info = inspect_trace(trace, bin_s=args.bin_s)
    if args.svg:
        Path(args.svg).parent.mkdir(parents=True, exist_ok=True)
        Path(args.svg).write_text(svg_plot(trace, info))
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        sys.stdout.write(summary_text(trace, info))
        if args.svg:
            print(f"\nplot: {args.svg}")
    return 0


def _fit_text(result: dict[str, Any]) -> str:
    from netgain.loadgen.traces.fit import MODELS

    lines = [
        f"fit of {result['source'] or 'trace'}: {result['requests']:,} requests over "
        f"{result['duration_s']:.3f} s",
        "",
        f"  {'model':<8} {'score':>8} {'KS gaps':>8} {'KS counts':>9}  parameters",
    ]
    for name in MODELS:
        e = result[name]
        if e["params"] is None:
            lines.append(f"  {name:<8} {'-':>8} {'-':>8} {'-':>9}  not fitted: {e.get('note', '')}")
            continue
        params = "  ".join(f"{k}={v:.4g}" for k, v in e["params"].items() if k != "arrival")
        mark = "  <- best" if name == result["best"] else ""
        lines.append(
            f"  {name:<8} {e['score']:>8.3g} {e['ks_interarrival']:>8.4f} {e['ks_counts']:>9.4f}  "
            f"{params}{mark}"
        )
    size = result["size"]
    lines += [
        "",
        f"  sizes: median {size['size_bytes']} bytes, lognormal sigma {size['size_sigma']}",
        f"  items: {result['items']}",
        "",
        "  score: the larger of the two KS statistics, each over its 95% critical value, against a",
        "  trace synthesized from the fit; <= 1 means consistent. best = the simplest consistent model.",
        "  Reuse: netgain trace fit FILE --json > fit.json; netgain trace synth --from-fit fit.json ...",
    ]
    return "\n".join(lines) + "\n"


def cmd_fit(args: argparse.Namespace) -> int:
    from netgain.loadgen.traces import fit, read_trace

    result = fit(read_trace(args.file))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        sys.stdout.write(_fit_text(result))
    return 0


def cmd_rescale(args: argparse.Namespace) -> int:
    from netgain.loadgen.traces import read_trace, rescale, write_trace

    if args.rate is None and args.duration is None:
        raise CliError("give --rate, --duration or both")
    trace = rescale(read_trace(args.file), rate=args.rate, duration_s=args.duration)
    write_trace(trace, args.out)
    _wrote(args.out, trace)
    return 0
