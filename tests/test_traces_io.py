"""Trace files (CSV, JSON lines, Parquet), malformed rows, and access-log import."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from netgain.loadgen.traces import Trace, TraceError, import_access_log, read_trace, synthesize, write_trace


@pytest.mark.parametrize("ext", ["csv", "jsonl", "ndjson", "parquet"])
def test_round_trip(tmp_path: Path, ext: str) -> None:
    tr = synthesize("gamma", 500, 20, seed=3, size_bytes=1500, size_sigma=1.0, items="1:0.8,32:0.2")
    path = tmp_path / f"sub/trace.{ext}"
    write_trace(tr, path)
    back = read_trace(path)
    assert back.digest() == tr.digest()
    assert np.array_equal(back.t_s, tr.t_s)  # exact, not just to the nanosecond
    assert back.source == f"file:{path}"
    assert not list(path.parent.glob(".*tmp*"))


def test_optional_columns_and_t_s_alias(tmp_path: Path) -> None:
    p = tmp_path / "min.csv"
    p.write_text("t_s,other\n0,a\n0.25,b\n\n1.5,c\n")
    tr = read_trace(p)
    assert tr.t_s.tolist() == [0.0, 0.25, 1.5]
    assert tr.size.tolist() == [0, 0, 0] and tr.items.tolist() == [1, 1, 1]
    j = tmp_path / "min.jsonl"
    j.write_text('{"t": 0.5, "size": 100}\n\n{"t": 1, "items": 4, "payload": "x.jpg"}\n')
    tr = read_trace(j)  # a missing (or null) size or items takes the default
    assert tr.size.tolist() == [100, 0] and tr.items.tolist() == [1, 4]
    j.write_text('{"t": 0.5, "size": null}\n{"t": 1, "size": "7"}\n{"t": 2}\n')
    assert read_trace(j).size.tolist() == [0, 7, 0]
    j.write_text('{"t": 0.5}\n{"size": 3}\n')
    with pytest.raises(TraceError, match=r"min\.jsonl:2: field 't': missing value"):
        read_trace(j)
    j.write_text('{"t": 0.5, "size": 100, "items": 2}\n{"t": 1, "size": 0, "items": 4}\n')
    assert read_trace(j).items.tolist() == [2, 4]
    empty = tmp_path / "empty.csv"
    empty.write_text("t,size,items\n")
    assert len(read_trace(empty)) == 0


CSV_CASES = [
    ("t,size,items\n0.0,10,1\nabc,10,1\n", 3, "t", "'abc' is not a number"),
    ("t,size,items\n0.0,10,1\n0.5,-3,1\n", 3, "size", "-3 is not valid"),
    ("t,size,items\n0.0,10,1\n0.5,10,1\n1.0,10,0\n", 4, "items", "0 is not valid"),
    ("t,size,items\n0.0,10,1\n2.0,10,1\n1.0,10,1\n", 4, "t", "earlier than the previous row's 2"),
    ("t,size,items\n-1.0,10,1\n", 2, "t", ">= 0"),
    ("t,size,items\n0.0,10.5,1\n", 2, "size", "whole number"),
    ("t,size,items\n0.0,,1\n", 2, "size", "empty value"),
    ("t,size,items\n0.0,1,1\n\n\n1.0,x,1\n", 5, "size", "'x' is not a number"),  # blank lines still counted
    ('t,size,items\n0.0,1,1\n1.0,"2\n",1\n2.0,1,z\n', 5, "items", "'z'"),  # a quoted field over two lines
    ("t,size,items\n0.0,1,inf\n", 2, "items", "inf"),
]


@pytest.mark.parametrize("content,line,field,msg", CSV_CASES)
def test_malformed_csv_rows_name_file_line_and_field(
    tmp_path: Path, content: str, line: int, field: str, msg: str
) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(TraceError) as err:
        read_trace(p)
    e = err.value
    assert (e.path, e.line, e.field) == (str(p), line, field)
    assert str(e).startswith(f"{p}:{line}: field '{field}': ")
    assert msg in str(e)
    assert isinstance(e, ValueError)


def test_malformed_jsonl_and_parquet(tmp_path: Path) -> None:
    j = tmp_path / "bad.jsonl"
    j.write_text('{"t": 0}\n{"t": 1}\n{"t": "soon"}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:3: field 't': 'soon' is not a number"):
        read_trace(j)
    j.write_text('{"t": 0}\n\n{"t": 1,\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:3: not valid JSON"):
        read_trace(j)
    j.write_text('{"t": 0, "items": 1}\n{"t": 1, "items": 0}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2: field 'items'"):
        read_trace(j)
    q = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"t": [0.0, 1.0, 0.5], "size": [1, 2, 3]}), q)
    with pytest.raises(TraceError, match=r"bad.parquet: row 3: field 't': arrival time 0.5 is earlier"):
        read_trace(q)


def test_file_level_errors(tmp_path: Path) -> None:
    p = tmp_path / "no_t.csv"
    p.write_text("time,size\n1,2\n")
    with pytest.raises(TraceError, match=r"no_t.csv:1: no arrival time column"):
        read_trace(p)
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(TraceError, match="empty"):
        read_trace(tmp_path / "empty.csv")
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(tmp_path / "x.txt")
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="unknown trace format"):
        write_trace(synthesize("constant", 1, 2), tmp_path / "x.xlsx")


def test_million_rows_are_fast(tmp_path: Path) -> None:
    n = 1_000_000
    rng = np.random.default_rng(0)
    tr = Trace(np.cumsum(rng.exponential(1e-3, n)), rng.integers(0, 1 << 20, n), rng.integers(1, 9, n))
    for ext in ("csv", "parquet"):
        p = tmp_path / f"big.{ext}"
        write_trace(tr, p)
        t0 = time.perf_counter()
        back = read_trace(p)
        assert time.perf_counter() - t0 < 5.0
        assert back == tr


# ------------------------------------------------------------------------------------ access logs


def test_import_csv_log_iso_unsorted(tmp_path: Path) -> None:
    p = tmp_path / "access.csv"
    p.write_text(
        "time,bytes,batch,path\n"
        "2024-05-01T12:00:01.500Z,2048,2,/v1/infer\n"
        "2024-05-01T12:00:00Z,-,1,/v1/infer\n"
        "2024-05-01T14:00:02.25+02:00,512,,/v1/infer\n"
    )
    tr = import_access_log(p, time_column="time", size_column="bytes", items_column="batch")
    assert tr.t_s.tolist() == [0.0, 1.5, 2.25]  # sorted, offsets from the first, zone offsets applied
    assert tr.size.tolist() == [0, 2048, 512]  # '-' = default size
    assert tr.items.tolist() == [1, 2, 1]  # empty = 1
    assert tr.source.startswith("access-log:")


def test_import_jsonl_log_epoch_ms_nested(tmp_path: Path) -> None:
    p = tmp_path / "access.jsonl"
    rows = [(1714564800250, 10), (1714564800000, 20), (1714564801000, 30), (1714564800250, 40)]
    p.write_text("".join(json.dumps({"ts_ms": ms, "req": {"size": s}}) + "\n" for ms, s in rows))
    tr = import_access_log(p, time_column="ts_ms", size_column="req.size")
    assert tr.t_s.tolist() == [0.0, 0.25, 0.25, 1.0]
    assert tr.size.tolist() == [20, 10, 40, 30]  # stable sort keeps log order for ties
    ms = import_access_log(p, time_column="ts_ms", time_format="ms")
    assert ms == import_access_log(p, time_column="ts_ms")
    as_s = import_access_log(p, time_column="ts_ms", time_format="s")
    assert as_s.duration_s == pytest.approx(1000.0)


@pytest.mark.parametrize(
    "values,fmt,expected",
    [
        (["1714564800.5", "1714564800.75"], "auto", [0.0, 0.25]),
        (["1714564800000000", "1714564800250000"], "auto", [0.0, 0.25]),
        (["1714564800000000000", "1714564800000000100"], "auto", [0.0, 1e-7]),
        (["2024-05-01 12:00:00", "2024-05-01 12:00:00.125"], "iso", [0.0, 0.125]),
        (["01/May/2024:12:00:00 +0000", "01/May/2024:12:00:03 +0000"], "%d/%b/%Y:%H:%M:%S %z", [0.0, 3.0]),
    ],
)
def test_import_time_formats(tmp_path: Path, values: list[str], fmt: str, expected: list[float]) -> None:
    p = tmp_path / "log.tsv"
    p.write_text("when\tsize\n" + "".join(f"{v}\t1\n" for v in values))
    tr = import_access_log(p, time_column="when", time_format=fmt)
    assert tr.t_s == pytest.approx(expected, abs=1e-9)


def test_import_errors(tmp_path: Path) -> None:
    p = tmp_path / "log.csv"
    p.write_text("ts,bytes\n1714564800.5,10\n1714564800.7,-5\n")
    with pytest.raises(TraceError, match=r"log.csv:3: field 'bytes': -5 is not valid"):
        import_access_log(p, time_column="ts", size_column="bytes")
    with pytest.raises(TraceError, match=r"log.csv:1: no column 'size'"):
        import_access_log(p, time_column="ts", size_column="size")
    p.write_text("ts\n2024-05-01T12:00:00Z\nyesterday\n")
    with pytest.raises(TraceError, match=r"log.csv:3: field 'ts': 'yesterday' is not an ISO-8601 time"):
        import_access_log(p, time_column="ts")
    p.write_text("ts\n1714564800\nsoon\n")
    with pytest.raises(TraceError, match=r"log.csv:3: field 'ts': 'soon' is not a number"):
        import_access_log(p, time_column="ts")
    p.write_text("ts\n01/May/2024\n")
    with pytest.raises(TraceError, match=r"log.csv:2: field 'ts': .* does not match the time format"):
        import_access_log(p, time_column="ts", time_format="%Y-%m-%d")
    j = tmp_path / "log.jsonl"
    j.write_text('{"ts": 1}\n{"other": 2}\n')
    with pytest.raises(TraceError, match=r"log.jsonl:2: field 'ts': missing timestamp"):
        import_access_log(j, time_column="ts")
    with pytest.raises(TraceError, match=r"no record has a field 'nope'"):
        import_access_log(j, time_column="nope")
