"""The run directory (docs/run-directory.md): its file names, its schema version, and writing and
reading its JSON documents, ``meta.json`` (by ``netgain load``) and ``report.json`` (by
``netgain report``; its type and reader: ``netgain.contract.report``), the version checked on read.

The version covers the whole directory: a reader that accepts ``meta.json`` reads the tables
(``requests.parquet``, ``samples.parquet``) by the columns of ``netgain.contract.records``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from netgain.errors import NetgainError

#: The version of the run-directory schema this netgain writes, and the only one it reads.
SCHEMA_VERSION = 1
#: The key holding it, first in ``meta.json`` and ``report.json``.
SCHEMA_KEY = "schema"
#: Send-lag p99 (ms) above which a run is invalid: ``netgain load``'s default, and the report's for a
#: ``meta.json`` that names no ``max_send_lag_ms``.
DEFAULT_MAX_SEND_LAG_MS = 5.0

META = "meta.json"
REQUESTS = "requests.parquet"
SAMPLES = "samples.parquet"
LOCUST_STATS = "locust_stats.csv"
LOCUST_FAILURES = "locust_failures.csv"
REPORT = "report.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
REPORT_FILES = (REPORT, REPORT_MD, REPORT_HTML)


class RunDirError(NetgainError):
    """A run-directory file that cannot be read; the message names the file and how to fix it."""


class SchemaVersionError(RunDirError):
    """A ``meta.json`` or ``report.json`` of another schema version than this netgain reads, or of
    none."""


def stamped(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with ``"schema": SCHEMA_VERSION`` as its first key (replacing any other)."""
    out: dict[str, Any] = {SCHEMA_KEY: SCHEMA_VERSION}
    out.update((k, v) for k, v in doc.items() if k != SCHEMA_KEY)
    return out


def check_schema(doc: Mapping[str, Any], path: str | Path) -> None:
    """Raise SchemaVersionError, naming ``path`` and both versions, unless ``doc`` is of
    SCHEMA_VERSION."""
    found = doc.get(SCHEMA_KEY)
    if found == SCHEMA_VERSION and type(found) is int:
        return
    if found is None:
        raise SchemaVersionError(
            f"{path} has no run-directory schema version ({SCHEMA_KEY!r}; this netgain reads "
            f"schema {SCHEMA_VERSION}): it was not written by `netgain load`/`netgain report`; "
            "write it again with this netgain"
        )
    raise SchemaVersionError(
        f"{path} is of run-directory schema {found!r}, but this netgain reads schema "
        f"{SCHEMA_VERSION}: read it with the netgain version that wrote it, or write it again "
        "with this one"
    )


def write_meta(run_dir: str | Path, meta: Mapping[str, Any]) -> Path:
    """Write ``RUN_DIR/meta.json`` (indented by 2, the schema version first); return its path."""
    path = Path(run_dir) / META
    with open(path, "w") as fh:
        json.dump(stamped(meta), fh, indent=2)
    return path


def encode_report(report: Mapping[str, Any], default: Callable[[Any], Any] | None = None) -> str:
    """``report.json``'s text, without the final newline: strict JSON (no NaN), indented by 1, the
    schema version first. ``default`` serialises what json cannot (numpy scalars)."""
    return json.dumps(stamped(report), indent=1, default=default, allow_nan=False)


def write_report(
    run_dir: str | Path, report: Mapping[str, Any], default: Callable[[Any], Any] | None = None
) -> Path:
    """Write ``RUN_DIR/report.json`` (``encode_report`` and a newline); return its path."""
    path = Path(run_dir) / REPORT
    path.write_text(encode_report(report, default) + "\n")
    return path


def read_json(run_dir: str | Path, name: str, writer: str) -> dict[str, Any]:
    """``RUN_DIR/name`` as a JSON object of this schema version (``writer`` names what writes it)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise RunDirError(
            f"run directory {str(run)!r} does not exist: pass the --out folder of `netgain load`"
        )
    path = run / name
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunDirError(
            f"{path} is missing: is {str(run)!r} a run directory written by `{writer}`?"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDirError(
            f"{path} is not valid JSON ({exc}): re-run `{writer}` or restore the file"
        ) from None
    if not isinstance(doc, dict):
        raise RunDirError(f"{path} must hold a JSON object: re-run `{writer}`")
    check_schema(doc, path)
    return doc


def read_meta(run_dir: str | Path) -> dict[str, Any]:
    """``RUN_DIR/meta.json``; RunDirError when it is missing or unreadable, SchemaVersionError when
    it is of another schema version."""
    return read_json(run_dir, META, "netgain load")
