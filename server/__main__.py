"""``python -m netgain.server [serve flags]``: the server alone, same flags as ``netgain serve``."""

from __future__ import annotations

import argparse
import sys

from netgain.server import cli
from netgain.server.cliargs import debug_after_command


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m netgain.server")
    parser.add_argument("--debug", action="store_true")
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    debug_after_command(sub)
    args = parser.parse_args(["serve", *sys.argv[1:]])
    from netgain.loadgen.cli import dispatch

    return dispatch(parser, args)


if __name__ == "__main__":
    sys.exit(main())
