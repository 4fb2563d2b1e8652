"""argparse helpers: every flag also reads ``NETGAIN_<FLAG>`` from the environment."""

from __future__ import annotations

import argparse
import os
from typing import Any

from netgain.errors import NetgainError


class CliError(NetgainError):
    """An argument error: printed as one line, exit status 2, no traceback (unless --debug)."""


def env_name(flag: str) -> str:
    return "NETGAIN_" + flag.lstrip("-").upper().replace("-", "_")


def flag(parser: argparse.ArgumentParser | Any, name: str, **kw: Any) -> None:
    """``parser.add_argument(name, **kw)`` with the default taken from ``NETGAIN_<NAME>`` when set."""
    env = env_name(name)
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
