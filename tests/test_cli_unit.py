"""Unit tests of the command-line helpers shared by `netgain` and `python -m netgain.server`."""

from __future__ import annotations

import argparse

import pytest

from netgain.cli.args import CliError, env_name, flag, key_values


def test_cli_key_values_and_env_names() -> None:
    assert key_values(["size=32", " max_pixels = 100 "], "--handler-option") == {
        "size": "32",
        "max_pixels": "100",
    }
    with pytest.raises(CliError, match="--handler-option 'size': expected key=value"):
        key_values(["size"], "--handler-option")
    assert env_name("--max-queue-delay-ms") == "NETGAIN_MAX_QUEUE_DELAY_MS"


def test_cli_help_shows_zero_defaults_and_hides_unset_ones() -> None:
    p = argparse.ArgumentParser()
    flag(p, "--seed", type=int, default=0, help="seed")
    flag(p, "--ratio", type=float, default=0.0, help="ratio")
    flag(p, "--tls-cert", default=None, help="cert")
    flag(p, "--debug-x", action="store_true", help="switch")
    helps = {a.dest: a.help for a in p._actions}
    assert helps["seed"] == "seed [env NETGAIN_SEED; default 0]"
    assert helps["ratio"] == "ratio [env NETGAIN_RATIO; default 0.0]"
    assert helps["tls_cert"] == "cert [env NETGAIN_TLS_CERT]"
    assert helps["debug_x"] == "switch [env NETGAIN_DEBUG_X]"


def test_debug_is_taken_before_or_after_a_subcommand() -> None:
    from netgain.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["trace", "inspect", "t.csv", "--debug"]).debug is True  # nested subcommand
    assert parse(["report", "run", "--debug"]).debug is True
    assert parse(["--debug", "report", "run"]).debug is True  # not reset by the subcommand
    assert parse(["report", "run"]).debug is False
