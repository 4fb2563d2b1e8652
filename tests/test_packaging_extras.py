"""Dependencies by role (pyproject.toml extras): a load-generator host gets no torch, a server
no Locust; `all` is what `netgain demo` needs; a command without its role names the extra."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from netgain.cli import ROLE_EXTRAS, dispatch

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in reqs}


def closure(extra: str) -> set[str]:
    """Package names an extra installs beyond the core, following netgain[...] references."""
    out: set[str] = set()
    for r in EXTRAS[extra]:
        m = re.fullmatch(r"netgain\[([a-z,]+)\]", r)
        if m:
            for e in m.group(1).split(","):
                out |= closure(e)
        else:
            out |= names([r])
    return out


def test_roles() -> None:
    core = names(PROJECT["dependencies"])
    assert {"serve", "load", "report", "gpu", "profile", "dev", "all"} <= set(EXTRAS)
    assert not core & {"torch", "locust", "tokenizers", "py-spy", "pyarrow"}
    assert (
        "torch" in closure("serve") and "locust" not in closure("serve") and "flask" not in closure("serve")
    )
    assert "locust" in closure("load") and "torch" not in closure("load") | closure("report")
    assert "py-spy" in closure("profile")
    assert {"torch", "locust", "pyarrow"} <= closure("all") and closure("all") <= closure("dev")
    # each package a command imports lazily belongs to the extra its error names
    for module, extra in ROLE_EXTRAS.items():
        pkg = {"pynvml": "nvidia-ml-py", "gevent": "locust"}.get(module, module)  # gevent: with Locust
        assert all(pkg in closure(e) for e in extra.split(",")), (module, extra)


def test_locust_bounded_above() -> None:
    (locust,) = [r for r in EXTRAS["load"] if r.startswith("locust")]
    assert "<" in locust, "the load generator uses Locust's private APIs: bound it above"


def test_missing_role_names_its_extra(capsys: pytest.CaptureFixture[str]) -> None:
    def needs_torch(_: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    args = argparse.Namespace(func=needs_torch, command="serve", debug=False)
    assert dispatch(argparse.ArgumentParser(), args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "netgain[serve]" in err and "torch is not installed" in err
