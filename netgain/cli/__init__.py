"""The ``netgain`` command: one entry point, one subcommand per job, one module per subcommand.

``serve`` (netgain.cli.serve), ``load``, ``report``, ``trace``, ``compare``/``drill``/``profile``
(netgain.cli.experiments) and ``demo``; ``args`` holds the flag helpers (every flag also reads
``NETGAIN_<FLAG>``) and ``CliError``. The library (netgain.server, netgain.loadgen) never imports
this package: it raises ``netgain.errors.NetgainError``, which ``dispatch`` prints as one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from netgain.cli.args import OneLineParser, debug_after_command
from netgain.errors import NetgainError


def build_parser() -> argparse.ArgumentParser:
    from netgain.cli import demo, experiments, load, report, serve, trace, tune

    parser = OneLineParser(
        prog="netgain",
        description="Is moving this model's inference from CPU to GPU a net gain? Measure it end to end.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parser(sub)
    load.add_parser(sub)
    report.add_parser(sub)
    trace.add_parser(sub)
    experiments.add_parser(sub)
    tune.add_parser(sub)
    demo.add_parser(sub)
    debug_after_command(sub)
    return parser


# The packages of each role's extra (pyproject.toml), imported only by the commands that need them.
ROLE_EXTRAS = {
    "torch": "serve",
    "tokenizers": "serve",
    "psutil": "serve",
    "aiohttp": "serve",
    "locust": "load",
    "gevent": "load",
    "msgpack": "load",
    "pyarrow": "load,report",
    "pynvml": "gpu",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    return dispatch(parser, parser.parse_args(argv))


def dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run a parsed subcommand: user errors (NetgainError, which CliError is, and OS and value errors)
    become one line and exit status 2."""
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    for line in getattr(args, "_env_warnings", None) or []:
        print(f"netgain {args.command}: warning: {line}", file=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `netgain report DIR | head -1`: the reader has what it wanted; say nothing, and keep
        # the interpreter's final flush of stdout from failing too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("netgain: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        extra = ROLE_EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None or args.debug:
            raise
        print(
            f"netgain {args.command}: error: {exc.name} is not installed: this command needs the "
            f"'{extra}' extra (pip install 'netgain[{extra}]', or 'netgain[all]' for every role)",
            file=sys.stderr,
        )
        return 2
    except (NetgainError, FileNotFoundError, PermissionError, OSError, ValueError) as exc:
        if args.debug:
            raise
        print(f"netgain {args.command}: error: {exc}", file=sys.stderr)
        return 2
