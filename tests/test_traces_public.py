"""Public production traces by name (``netgain trace import FILE --format NAME``): the mappings from
each dataset's rows to arrivals, sizes and kept columns, checked against the sample files read
independently (csv/json and exact decimal arithmetic), and their one-line errors."""

from __future__ import annotations

import csv
import json
from collections import Counter
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_traces_cli import run

from netgain.cli import trace as cli_trace
from netgain.loadgen.traces import PUBLIC_FORMATS, TraceError, import_public, read_trace, write_trace
from netgain.loadgen.traces.public import BYTES_PER_TOKEN, SPREADS
from netgain.loadgen.traces.public.functions import spread_minutes

DATA = Path(__file__).resolve().parent / "data" / "traces"
AZ23 = DATA / "azure_llm_2023_code.csv"
AZ24 = DATA / "azure_llm_2024_code.csv"
FUNCS = DATA / "azure_functions_2019_d01.csv"
MOONCAKE = DATA / "mooncake_conversation.jsonl"
BURST = DATA / "burstgpt_1.csv"


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def azure_seconds(stamp: str) -> Decimal:
    """Exact seconds since the epoch of an Azure TIMESTAMP (7 fractional digits kept)."""
    main, _, rest = stamp.partition(".")
    frac = rest.split("+")[0] if rest else "0"
    whole = datetime.fromisoformat(main.split("+")[0] + "+00:00")
    return Decimal(int(whole.timestamp())) + Decimal("0." + frac)


def offsets(values: list[Decimal]) -> np.ndarray:
    return np.array([float(v - min(values)) for v in values])


def test_the_command_line_names_the_library_s_formats() -> None:
    assert tuple(PUBLIC_FORMATS) == cli_trace.PUBLIC_FORMATS
    assert cli_trace.BYTES_PER_TOKEN == BYTES_PER_TOKEN == 4.0
    choices = {a.dest: a.choices for a in _import_parser()._actions}
    assert tuple(choices["spread"]) == SPREADS and tuple(choices["format"]) == tuple(PUBLIC_FORMATS)


def _import_parser() -> object:
    import argparse

    sub = argparse.ArgumentParser(prog="netgain").add_subparsers()
    p = cli_trace.add_parser(sub)
    acts = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return acts.choices["import"]


@pytest.mark.parametrize("path,fmt", [(AZ23, "azure-llm-2023"), (AZ24, "azure-llm-2024")])
def test_azure_llm_rows_become_requests(path: Path, fmt: str) -> None:
    src = rows(path)
    imp = import_public(path, fmt)
    tr = imp.trace
    assert len(tr) == len(src) and tr.source == f"{fmt}:{path}"
    want_t = offsets([azure_seconds(r["TIMESTAMP"]) for r in src])  # the samples are in time order
    np.testing.assert_allclose(tr.t_s, want_t, rtol=0, atol=1e-9)
    context = [int(r["ContextTokens"]) for r in src]
    assert tr.size.tolist() == [4 * c for c in context] and set(tr.items.tolist()) == {1}
    assert imp.extra["input_tokens"].to_pylist() == context
    assert imp.extra["output_tokens"].to_pylist() == [int(r["GeneratedTokens"]) for r in src]
    assert f"{fmt}: {len(src)} rows" in imp.note and "ContextTokens x 4 bytes" in imp.note


def test_azure_2023_keeps_the_seventh_fractional_digit_and_2024_the_zone() -> None:
    t = import_public(AZ23, "azure-llm-2023").trace.t_s
    assert t[1] == pytest.approx(0.052, abs=1e-12)  # 18:17:03.9799600 -> 18:17:04.0319600
    assert t[12] == pytest.approx(29.479069, abs=1e-12)  # -> 18:17:33.4590290
    t24 = import_public(AZ24, "azure-llm-2024").trace.t_s
    whole = [i for i, r in enumerate(rows(AZ24)) if "." not in r["TIMESTAMP"]]
    assert whole and t24[whole[0]] == pytest.approx(1.0 - 0.009930, abs=1e-12)  # 00:00:01+00:00


def test_bytes_per_token_rounds_floors_at_one_byte_and_zero_means_the_default_size() -> None:
    context = np.array([int(r["ContextTokens"]) for r in rows(AZ24)])
    half = import_public(AZ24, "azure-llm-2024", bytes_per_token=2.5).trace.size
    assert half.tolist() == np.maximum(np.rint(context * 2.5), 1).astype(int).tolist()
    assert set(import_public(AZ24, "azure-llm-2024", bytes_per_token=0).trace.size.tolist()) == {0}
    burst = import_public(BURST, "burstgpt").trace
    request = [int(r["Request tokens"]) for r in rows(BURST)]
    assert 0 in request and burst.size.tolist() == [max(1, 4 * n) for n in request]
    with pytest.raises(ValueError, match="bytes per token"):
        import_public(AZ24, "azure-llm-2024", bytes_per_token=-1)


def test_mooncake_milliseconds_sizes_and_hash_ids() -> None:
    src = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    imp = import_public(MOONCAKE, "mooncake")
    ts = [r["timestamp"] for r in src]
    assert imp.trace.t_s.tolist() == [(x - ts[0]) / 1000 for x in ts]
    assert imp.trace.size.tolist() == [4 * r["input_length"] for r in src]
    assert imp.extra["output_tokens"].to_pylist() == [r["output_length"] for r in src]
    assert imp.extra["hash_ids"].to_pylist() == [r["hash_ids"] for r in src]


def test_burstgpt_seconds_and_columns_by_name_in_the_eight_column_release(tmp_path: Path) -> None:
    src = rows(BURST)
    imp = import_public(BURST, "burstgpt")
    assert imp.trace.t_s.tolist() == [float(int(r["Timestamp"]) - 5) for r in src]
    assert imp.extra["model"].to_pylist() == [r["Model"] for r in src]
    assert imp.extra["log_type"].to_pylist() == [r["Log Type"] for r in src]
    assert imp.extra["output_tokens"].to_pylist() == [int(r["Response tokens"]) for r in src]
    # Release v2.0 inserts Session ID and Elapsed time as the 2nd and 3rd columns; out of order here.
    v2 = tmp_path / "BurstGPT_3.csv"
    v2.write_text(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "30,s-1,2.5,ChatGPT,100,20,120,Conversation log\n"
        "10,,,GPT-4,7,0,7,API log\n"
        "30,s-1,1.25,ChatGPT,50,5,55,Conversation log\n"
    )
    imp = import_public(v2, "burstgpt", bytes_per_token=3)
    assert imp.trace.t_s.tolist() == [0.0, 20.0, 20.0]  # sorted, ties in file order
    assert imp.trace.size.tolist() == [21, 300, 150]
    assert imp.extra["session_id"].to_pylist() == ["", "s-1", "s-1"]
    assert imp.extra["elapsed_s"].to_pylist() == [None, 2.5, 1.25]
    assert imp.extra["model"].to_pylist() == ["GPT-4", "ChatGPT", "ChatGPT"]


# -- the functions trace: per-minute counts become arrivals ----------------------------------------
def test_spread_minutes_places_every_count_inside_its_minute() -> None:
    rng = np.random.default_rng(5)
    counts = [rng.integers(0, 7, size=4) for _ in range(30)]  # 30 minutes x 4 functions
    for spread in SPREADS:
        t, func = spread_minutes(counts, spread, np.random.default_rng(1))
        assert t.shape[0] == func.shape[0] == sum(int(c.sum()) for c in counts)
        got = Counter(zip((t // 60).astype(int).tolist(), func.tolist(), strict=True))
        want = {(m, f): int(c[f]) for m, c in enumerate(counts) for f in range(4) if c[f]}
        assert dict(got) == want
    t, _ = spread_minutes([np.array([0, 3]), np.array([1, 0])], "even", np.random.default_rng(0))
    assert t.tolist() == [10.0, 30.0, 50.0, 90.0]  # (k + 0.5) * 60 / c into the minute
    a, _ = spread_minutes(counts, "uniform", np.random.default_rng(2))
    b, _ = spread_minutes(counts, "uniform", np.random.default_rng(2))
    c, _ = spread_minutes(counts, "uniform", np.random.default_rng(3))
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


def test_functions_trace_has_one_request_per_invocation() -> None:
    src = rows(FUNCS)
    per_function = {r["HashFunction"]: sum(int(r[str(m)]) for m in range(1, 1441)) for r in src}
    first = min(m for r in src for m in range(1, 1441) if int(r[str(m)]))
    last = max(m for r in src for m in range(1, 1441) if int(r[str(m)]))
    for spread in SPREADS:
        imp = import_public(FUNCS, "azure-functions-2019", spread=spread, seed=7)
        tr = imp.trace
        assert len(tr) == sum(per_function.values()) == 96
        assert set(tr.size.tolist()) == {0} and np.all(np.diff(tr.t_s) >= 0) and tr.t_s[0] == 0
        assert tr.duration_s < (last - first + 1) * 60
        got = Counter(imp.extra["function"].to_pylist())
        assert got == {f: n for f, n in per_function.items() if n}
        trig = dict(zip(imp.extra["function"].to_pylist(), imp.extra["trigger"].to_pylist(), strict=True))
        assert all(trig[r["HashFunction"]] == r["Trigger"] for r in src if per_function[r["HashFunction"]])
    again = import_public(FUNCS, "azure-functions-2019", seed=7).trace
    assert again == import_public(FUNCS, "azure-functions-2019", seed=7).trace
    assert again != import_public(FUNCS, "azure-functions-2019", seed=8).trace
    http = import_public(FUNCS, "azure-functions-2019", triggers=["http"])
    assert len(http.trace) == sum(per_function[r["HashFunction"]] for r in src if r["Trigger"] == "http")
    assert set(http.extra["trigger"].to_pylist()) == {"http"}


# -- extra columns in the written file ---------------------------------------------------------------
@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
def test_kept_columns_are_written_and_readers_ignore_them(tmp_path: Path, ext: str) -> None:
    imp = import_public(MOONCAKE, "mooncake")
    out = tmp_path / f"t.{ext}"
    write_trace(imp.trace, out, imp.extra)
    assert read_trace(out) == imp.trace
    if ext == "csv":
        first = rows(out)[0]
        assert first["hash_ids"] == " ".join(str(i) for i in imp.extra["hash_ids"][0].as_py())
        assert int(first["input_tokens"]) == imp.extra["input_tokens"][0].as_py()
    elif ext == "jsonl":
        assert json.loads(out.read_text().splitlines()[0])["hash_ids"] == imp.extra["hash_ids"][0].as_py()
    else:
        assert pq.read_table(out).column("hash_ids").to_pylist() == imp.extra["hash_ids"].to_pylist()
    funcs = import_public(FUNCS, "azure-functions-2019")
    write_trace(funcs.trace, out, funcs.extra)  # dictionary-encoded strings
    assert read_trace(out) == funcs.trace
    with pytest.raises(ValueError, match="shadow"):
        write_trace(imp.trace, out, {"size": imp.extra["input_tokens"]})
    with pytest.raises(ValueError, match="40 requests"):
        write_trace(imp.trace, out, {"x": pa.array([1, 2])})


# -- bad input: one line naming file, line and field -------------------------------------------------
def _error(path: Path, fmt: str) -> str:
    with pytest.raises(TraceError) as exc:
        import_public(path, fmt)
    return str(exc.value)


def test_bad_rows_name_file_line_and_field(tmp_path: Path) -> None:
    az = tmp_path / "az.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,10,1\r\n"
                  "yesterday,5,1\r\n")  # fmt: skip
    assert _error(az, "azure-llm-2023") == (
        f"{az}:3: field 'TIMESTAMP': 'yesterday' is not an ISO-8601 time (e.g. 2024-05-01T12:00:00.250Z)"
    )
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.1+00:00,10,1\n\n"
                  "2024-05-10 00:00:00.2+00:00,-5,1\n")  # fmt: skip
    assert _error(az, "azure-llm-2024") == (
        f"{az}:4: field 'ContextTokens': -5 is not valid: need a whole number of tokens >= 0"
    )
    az.write_text("TIMESTAMP,Tokens\n2024-05-10 00:00:00.1+00:00,10\n")
    msg = _error(az, "azure-llm-2024")
    assert msg.startswith(f"{az}:1: no column 'ContextTokens'") and "TIMESTAMP,ContextTokens" in msg
    mc = tmp_path / "mc.jsonl"
    mc.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 3,\n')
    assert _error(mc, "mooncake").startswith(f"{mc}:2: not valid JSON")
    mc.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                  '{"timestamp": 3, "output_length": 1}\n')  # fmt: skip
    assert _error(mc, "mooncake").startswith(f"{mc}:2: field 'input_length': ")
    mc.write_text('{"timestamp": 0, "input_length": 5.5, "output_length": 1, "hash_ids": [1]}\n')
    assert _error(mc, "mooncake") == (
        f"{mc}:1: field 'input_length': 5.5 is not valid: need a whole number of tokens >= 0"
    )
    bg = tmp_path / "bg.csv"
    bg.write_text(BURST.read_text().replace("45,ChatGPT,1087", "45,ChatGPT,many"))
    assert _error(bg, "burstgpt") == f"{bg}:3: field 'Request tokens': 'many' is not a number"
    assert _error(BURST, "mooncake").startswith(f"{BURST}:1: not valid JSON")
    assert _error(MOONCAKE, "burstgpt").startswith(f"{MOONCAKE}:1: no column 'Timestamp'")


def test_bad_minute_counts_name_the_line_and_minute(tmp_path: Path) -> None:
    lines = FUNCS.read_text().splitlines()
    cells = lines[3].split(",")
    cells[4 + 16] = "x"  # minute 17 of the third function: line 4
    bad = tmp_path / "d01.csv"
    bad.write_text("\n".join([*lines[:3], ",".join(cells), *lines[4:]]) + "\n")
    assert _error(bad, "azure-functions-2019") == f"{bad}:4: field '17': 'x' is not a number"
    cells[4 + 16] = "-2"
    bad.write_text("\n".join([*lines[:3], ",".join(cells), *lines[4:]]) + "\n")
    assert _error(bad, "azure-functions-2019") == (
        f"{bad}:4: field '17': -2 is not valid: need a whole number of invocations >= 0"
    )
    bad.write_text(lines[0].rsplit(",", 1)[0] + "\n")  # minute 1440 missing
    assert _error(bad, "azure-functions-2019").startswith(f"{bad}:1: no column '1440'")


def test_command_line_import_and_its_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "t.jsonl"
    rc, stdout, _ = run(["trace", "import", str(BURST), "--format", "burstgpt", "--out", str(out)], capsys)
    assert rc == 0 and "burstgpt: 30 rows" in stdout and f"wrote {out}: 30 requests" in stdout
    assert read_trace(out) == import_public(BURST, "burstgpt").trace
    rc, stdout, _ = run(
        ["trace", "import", str(FUNCS), "--format", "azure-functions-2019", "--spread", "even",
         "--trigger", "http,queue", "--out", str(out)], capsys,
    )  # fmt: skip
    assert rc == 0 and "spread evenly" in stdout and "with trigger http,queue" in stdout
    assert read_trace(out) == import_public(FUNCS, "azure-functions-2019", spread="even",
                                            triggers=["http", "queue"]).trace  # fmt: skip
    for argv, needle in (
        (["--format", "mooncake", "--time-column", "t"], "--time-column is for an access log"),
        (["--format", "mooncake", "--time-format", "ms"], "--time-format is for an access log"),
        (["--format", "mooncake", "--spread", "even"], "--spread does not apply to --format mooncake"),
        (["--format", "azure-functions-2019", "--bytes-per-token", "2"], "--bytes-per-token does not apply"),
        (["--bytes-per-token", "2"], "--bytes-per-token is for a public trace: give --format NAME"),
        ([], "give --time-column C (an access log) or --format NAME"),
        (["--format", "azure-llm-2024", "--bytes-per-token", "-1"], "bytes per token -1 must be"),
    ):
        rc, _, err = run(["trace", "import", str(MOONCAKE), *argv, "--out", str(out)], capsys)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (argv, err)
    rc, _, err = run(["trace", "import", str(MOONCAKE), "--format", "sharegpt", "--out", str(out)], capsys)
    assert rc == 2 and "invalid choice: 'sharegpt'" in err
    rc, _, err = run(["trace", "import", str(MOONCAKE), "--format", "burstgpt", "--out", str(out)], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"netgain trace: error: {MOONCAKE}:1: no column 'Timestamp'") and "--format" in err
    monkeypatch.setenv("NETGAIN_FORMAT", "json")  # `report --format`'s variable: not read here
    monkeypatch.setenv("NETGAIN_TRACE_IMPORT_FORMAT", "mooncake")
    rc, stdout, _ = run(["trace", "import", str(MOONCAKE), "--out", str(out)], capsys)
    assert rc == 0 and "mooncake: 40 rows" in stdout
