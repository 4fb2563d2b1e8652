"""argparse helpers: every flag also reads an environment variable, ``NETGAIN_<FLAG>``, or
``NETGAIN_<COMMAND>_<FLAG>`` for the flags whose meaning differs between subcommands
(``PER_COMMAND``: ``NETGAIN_SERVE_METRICS_PORT`` and ``NETGAIN_LOAD_METRICS_PORT``), so one
variable has one meaning; and ``OneLineParser``, whose usage errors are one line."""

from __future__ import annotations

import argparse
import os
from typing import Any, NoReturn

from netgain.errors import NetgainError


class CliError(NetgainError):
    """An argument error: printed as one line, exit status 2, no traceback (unless --debug)."""


#: Flags that several subcommands have with different meanings (`serve --model` a handler, `trace
#: synth --model` an arrival model; `serve --metrics-port` the server's, `load --metrics-port` the
#: client's; `load --out` a run directory, `trace synth --out` a file...): each reads
#: NETGAIN_<COMMAND>_<FLAG> only. tests/test_cli_unit.py checks this list against the parser.
PER_COMMAND = frozenset(
    {"--model", "--metrics-port", "--out", "--seed", "--workers", "--duration", "--warmup-s", "--items"}
)
#: Every subcommand (tests/test_user_commands.py checks it against the parser).
COMMANDS = ("serve", "load", "report", "trace", "compare", "drill", "profile", "demo", "tune")


class OneLineParser(argparse.ArgumentParser):
    """Usage errors (a missing value, ``--rate abc``, an unknown flag) as one line, exit status 2,
    like every other error of the command; ``--help`` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_of(prog: str) -> str:
    """``netgain trace synth`` -> ``TRACE_SYNTH``; ``python -m netgain.server serve`` -> ``SERVE``;
    "" for a parser outside the netgain command."""
    words = prog.split()
    for i, w in enumerate(words):
        if w in COMMANDS:
            return "_".join(words[i:]).upper().replace("-", "_")
    return ""


def env_name(flag: str, command: str = "") -> str:
    """The variable a flag reads: ``NETGAIN_<FLAG>``, or ``NETGAIN_<COMMAND>_<FLAG>`` for the
    flags in PER_COMMAND (given the subcommand, as ``command_of`` names it)."""
    base = flag.lstrip("-").upper().replace("-", "_")
    if command and flag in PER_COMMAND:
        return f"NETGAIN_{command}_{base}"
    return "NETGAIN_" + base


def flag(parser: argparse.ArgumentParser | Any, name: str, **kw: Any) -> None:
    """``parser.add_argument(name, **kw)`` with the default taken from its variable when set
    (``env_name``). A per-command flag's bare ``NETGAIN_<NAME>``, set but not read, is said on one
    warning line when that subcommand runs (``env_warnings``)."""
    env = env_name(name, command_of(getattr(parser, "prog", "")))
    bare = env_name(name)
    if env != bare and bare in os.environ and env not in os.environ:
        warned = list(parser._defaults.get("_env_warnings", []))
        warned.append(f"{bare} is not read: {name}'s meaning differs between subcommands; set {env}")
        parser.set_defaults(_env_warnings=warned)
    raw = os.environ.get(env)
    action = kw.get("action")
    if raw is not None:
        if action == "store_true":
            kw["default"] = raw.strip().lower() in ("1", "true", "yes", "on")
        elif action == "append":
            kw["default"] = [v for v in raw.split(",") if v]
        else:
            kw["default"] = raw  # argparse applies `type` to string defaults
        kw["required"] = False
    help_text = kw.get("help", "")
    if help_text != argparse.SUPPRESS:
        default = kw.get("default")
        # identity for None/False: `0 in (False, ...)` is true, and 0 is a default worth showing
        hidden = default is None or default is False or default in ([], "")
        shown = f"; default {default}" if not hidden and "%(default)" not in help_text else ""
        kw["help"] = f"{help_text} [env {env}{shown}]"
    parser.add_argument(name, **kw)


def debug_after_command(subparsers: Any) -> None:
    """Accept ``--debug`` after the subcommand too (``netgain report X --debug``, ``netgain trace
    inspect X --debug``); SUPPRESS keeps a subcommand without it from resetting the top-level flag."""
    seen: set[int] = set()  # aliases list one parser under several names
    for sp in subparsers.choices.values():
        if id(sp) in seen:
            continue
        seen.add(id(sp))
        sp.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logs"
        )
        for action in sp._actions:  # nested actions (`trace inspect`): argparse has no public walk
            if isinstance(action, argparse._SubParsersAction):
                debug_after_command(action)


def key_values(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} {item!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out
