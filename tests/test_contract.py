"""The process contract (``netgain.contract``): one owner, imported by both sides, and a load side
that needs neither torch nor the server."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from analysis_fixtures import make_run

from netgain.analysis import AnalysisError, build_report
from netgain.contract import messages, payloads, records, rundir
from netgain.contract.report import read_report
from netgain.loadgen.payloads import PayloadFactory
from netgain.loadgen.runner import frames
from netgain.protos import inference_pb2 as pb
from netgain.server.handlers import BUILTIN, create_handler

# Modules a load-generator host runs: payload building, the Locust worker and its sender engine.
LOAD_SIDE = (
    "netgain.loadgen.payloads",
    "netgain.loadgen.runner.worker",
    "netgain.loadgen.runner.engine",
    "netgain.loadgen.runner.grpc_sender",
    "netgain.loadgen.runner.http_sender",
    "netgain.loadgen.runner.http_probe",
    "netgain.loadgen.runner.frames",
    "netgain.loadgen.runner.wire",
)
CONTRACT = (
    "netgain.contract.phases",
    "netgain.contract.records",
    "netgain.contract.messages",
    "netgain.contract.rundir",
    "netgain.contract.payloads",
)


def _pulled(modules: tuple[str, ...], then: str = "") -> list[str]:
    """Import ``modules`` (and run ``then``) in a fresh interpreter; the forbidden modules it pulled."""
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"{then}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tokenizers')"
        " or m == 'netgain.server' or m.startswith('netgain.server.'))\n"
        "print(','.join(bad))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [m for m in res.stdout.strip().split(",") if m]


def test_load_side_imports_neither_torch_nor_the_server() -> None:
    # Building every built-in model's payloads included: they come from the contract.
    build = (
        "from netgain.loadgen.payloads import PayloadFactory\n"
        "for model in ('image', 'text', 'tabular', 'null', 'resnet50', 'bert-base'):\n"
        "    PayloadFactory(model, seed=1).request_bytes(0, 2000, 2)\n"
    )
    assert _pulled(LOAD_SIDE, build) == []


def test_contract_imports_neither_side() -> None:
    code = (
        "import importlib, sys\n"
        f"for m in {CONTRACT!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tokenizers', 'grpc')"
        " or m.startswith(('netgain.server', 'netgain.loadgen', 'netgain.protos')))\n"
        "print(','.join(bad))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ""


@pytest.mark.parametrize("model", sorted(BUILTIN))
@pytest.mark.parametrize("size", [None, 7, 2000, 30_000])
def test_builtin_payloads_are_the_handlers_example_inputs(model: str, size: int | None) -> None:
    options = {"features": "5"} if model == "tabular" else {}
    handler = create_handler(model, options, seed=0)
    made = payloads.builtin_payloads(model, options)
    for seed in (0, 3):
        want = handler.example_input(random.Random(seed), size).SerializeToString()
        assert pb.Input(**made(random.Random(seed), size)).SerializeToString() == want


def test_builtin_models_are_the_servers() -> None:
    assert set(payloads.BUILTIN) == set(BUILTIN)


def test_bad_payload_option_and_unknown_model() -> None:
    with pytest.raises(ValueError, match="handler option features='x' is not an integer"):
        PayloadFactory("tabular", {"features": "x"})
    names = "bert-base, image, null, resnet50, tabular, text"
    with pytest.raises(ValueError, match=f"unknown model 'nope': use one of {names}"):
        PayloadFactory("nope")


def test_one_definition_of_the_message_names() -> None:
    for name in ("PLAN", "READY", "GO", "RECORDS", "DONE"):
        assert getattr(frames, name) is getattr(messages, name)


def test_record_schema_is_the_columns() -> None:
    assert tuple(records.record_schema().names) == records.RECORD_COLUMNS
    assert tuple(records.sample_schema().names) == records.SAMPLE_COLUMNS
    assert set(records.SERVER_COLUMNS) <= set(records.RECORD_COLUMNS)
    assert set(records.REQUIRED_COLUMNS) <= set(records.RECORD_COLUMNS)


def test_meta_round_trip_with_the_schema_first(tmp_path: Path) -> None:
    path = rundir.write_meta(tmp_path, {"run_id": "x", "schema": 99})
    text = path.read_text()
    assert text.startswith('{\n  "schema": 1,') and json.loads(text)["schema"] == rundir.SCHEMA_VERSION
    assert rundir.read_meta(tmp_path) == {"schema": rundir.SCHEMA_VERSION, "run_id": "x"}
    rundir.write_report(tmp_path, {"valid": True})
    assert rundir.read_json(tmp_path, rundir.REPORT, "netgain report") == {
        "schema": rundir.SCHEMA_VERSION,
        "valid": True,
    }


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (2, "is of run-directory schema 2, but this netgain reads schema 1"),
        ("1", "is of run-directory schema '1', but this netgain reads schema 1"),
        (None, "has no run-directory schema version ('schema'; this netgain reads schema 1)"),
    ],
)
def test_other_or_missing_schema_is_one_clear_error(tmp_path: Path, schema: object, message: str) -> None:
    run = make_run(tmp_path / "run", rate=50.0, duration_s=2.0, warmup_s=0.5)
    meta = json.loads((run / "meta.json").read_text())
    if schema is None:
        del meta["schema"]
    else:
        meta["schema"] = schema
    (run / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(rundir.SchemaVersionError) as exc:
        rundir.read_meta(run)
    assert str(exc.value).startswith(f"{run / 'meta.json'} {message}")
    with pytest.raises(AnalysisError, match=r"meta\.json .*schema"):
        build_report(run, bootstrap=0)
    (run / "report.json").write_text(json.dumps(meta))
    with pytest.raises(rundir.SchemaVersionError, match=r"report\.json"):
        read_report(run)
