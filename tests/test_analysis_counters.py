"""The report's cpu/gpu sections from counters (as the server now exports CPU and kernel time)
equal those from the ratio gauges older runs recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from analysis_fixtures import make_run

from netgain.analysis import build_report
from netgain.analysis.counters import increase_rates, with_ratios
from netgain.analysis.resources import series
from netgain.analysis.rundir import load_samples
from netgain.contract.records import sample_schema
from netgain.loadgen.runner.scrape import parse_samples

INSTANCES = 2

GAUGES: dict[str, Any] = {
    "netgain_gpu_utilization_ratio": 0.15,
    "netgain_kernel_busy_ratio": 0.1,
    "netgain_cpu_cores": 8,
    "netgain_process_cpu_ratio": 2.5,
    "netgain_thread_cpu_ratio": {"role=prepost": 1.96, "role=frontend": 0.3},
    "netgain_queue_depth_requests": lambda t: 5.0 * t,
}


def counters(start: float = 100.0) -> dict[str, Any]:
    """The same run as scraped counters: seconds accumulating at the gauges' rates (from an
    arbitrary start: a server up before the run), the kernel's over two instances."""
    return {
        "netgain_gpu_utilization_ratio": 0.15,
        "netgain_cpu_cores": 8,
        "netgain_queue_depth_requests": lambda t: 5.0 * t,
        "process_cpu_seconds_total": lambda t: start + 2.5 * t,
        "netgain_thread_cpu_seconds_total": {
            "role=prepost": lambda t: start + 1.96 * t,
            "role=frontend": lambda t: 0.3 * t,
        },
        "netgain_kernel_busy_seconds_total": lambda t: 0.1 * INSTANCES * t,
        "netgain_device_instances": INSTANCES,
    }


def flat(x: Any, key: str = "") -> dict[str, Any]:
    """Nested dicts and lists as one dict of leaves (approx compares no nested mappings)."""
    if isinstance(x, dict):
        return {k: v for kk, vv in x.items() for k, v in flat(vv, f"{key}.{kk}").items()}
    if isinstance(x, list | tuple):
        return {k: v for i, vv in enumerate(x) for k, v in flat(vv, f"{key}[{i}]").items()}
    return {key: x if isinstance(x, int | float) and not isinstance(x, bool) else str(x)}


def _report(tmp_path: Path, name: str, samples: dict[str, Any]) -> dict[str, Any]:
    run = make_run(tmp_path / name, rate=100.0, duration_s=10.0, warmup_s=2.0, device="cuda", samples=samples)
    return build_report(run, bootstrap=0)


def test_counters_give_the_gauges_report(tmp_path: Path) -> None:
    old, new = _report(tmp_path, "gauges", GAUGES), _report(tmp_path, "counters", counters())
    for section in ("cpu", "gpu", "queue"):
        assert flat(new[section]) == pytest.approx(flat(old[section])), section
    assert new["bottleneck"]["kind"] == old["bottleneck"]["kind"] == "upstream-bound"
    assert new["cpu"]["process_mean"] == pytest.approx(2.5)
    assert new["gpu"]["kernel_busy_mean"] == pytest.approx(0.1)


def test_increase_rates_counts_a_reset_from_zero() -> None:
    t = np.array([0.0, 1.0, 2.0, 3.0, 3.0])
    v = np.array([10.0, 12.0, 0.5, 2.5, 9.0])  # reset between 1 s and 2 s; a repeated time is skipped
    ts, rate = increase_rates(t, v)
    assert ts.tolist() == [1.0, 2.0, 3.0]
    assert rate.tolist() == pytest.approx([2.0, 0.5, 2.0])


def test_scrape_keeps_the_counters_and_report_derives_ratios() -> None:
    text = "\n".join(
        [
            "# TYPE process_cpu_seconds_total counter",
            "process_cpu_seconds_total 4.0",
            "# TYPE netgain_thread_cpu_seconds_total counter",
            'netgain_thread_cpu_seconds_total{model="null",device="cpu",role="frontend"} 3.0',
            'netgain_thread_cpu_seconds_created{model="null",device="cpu",role="frontend"} 1.7e9',
            "# TYPE netgain_device_instances gauge",
            'netgain_device_instances{model="null",device="cpu"} 1.0',
            "# TYPE netgain_server_info gauge",
            'netgain_server_info{model="null",device="cpu",dtype="float32"} 1.0',
            "",
        ]
    )
    rows = parse_samples(text, 1.0, "server:x") + [
        (2.0, "server:x", name, labels, value * 3)
        for _, _, name, labels, value in parse_samples(text, 1.0, "s")
    ]
    names = {r[2] for r in rows}
    assert names == {
        "process_cpu_seconds_total",
        "netgain_thread_cpu_seconds_total",
        "netgain_device_instances",
    }
    cols = list(zip(*rows, strict=True))
    table = pa.table(
        {
            "t_s": pa.array(cols[0], pa.float64()),
            "source": pa.array(cols[1]),
            "metric": pa.array(cols[2]),
            "labels": pa.array(cols[3]),
            "value": pa.array(cols[4], pa.float64()),
        }
    )
    out = with_ratios(table)
    derived = {
        (m, lab): v
        for m, lab, v in zip(
            out.column("metric").to_pylist(),
            out.column("labels").to_pylist(),
            out.column("value").to_pylist(),
            strict=True,
        )
        if m.endswith("_ratio")
    }
    assert derived == {
        ("netgain_process_cpu_ratio", ""): 8.0,
        ("netgain_thread_cpu_ratio", "role=frontend"): 6.0,
    }


def _series_by_lists(table: pa.Table, t0: float, t1: float) -> dict[str, list[tuple[str, list, list]]]:
    """What the report's series are, computed row by row from Python lists (the reference)."""
    rows = [r for r in table.to_pylist() if t0 <= r["t_s"] <= t1]
    out: dict[str, dict[str, tuple[list, list]]] = {}
    for r in rows:
        key = f"{r['source']}|{r['labels']}"
        ts, vs = out.setdefault(r["metric"], {}).setdefault(key, ([], []))
        ts.append(r["t_s"])
        vs.append(r["value"])
    return {m: [(k, *by_key[k]) for k in sorted(by_key)] for m, by_key in out.items()}


def test_samples_read_a_row_group_at_a_time_give_the_series_of_the_whole_file(tmp_path: Path) -> None:
    """Interleaved sources, a counter reset, rows out of time order, a source named so that its
    key collides with another's ("a|x" + "" and "a" + "x|"), row groups of 4 rows: the arrays the
    report reads give, metric by metric and key by key, the rows a plain pass over the table gives
    (the derived ratios included), and metrics come in order of first appearance."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        t = float(i // 2) + (0.5 if i % 2 else 0.0)
        rows.append((t, "server:1", "process_cpu_seconds_total", "", 0.5 * t if t < 12 else 0.2 * (t - 12)))
        rows.append((t, "server:2", "netgain_queue_depth_requests", "", float(rng.integers(0, 9))))
        rows.append((t, "a|x", "netgain_in_flight_requests", "", 1.0))
        rows.append((t, "a", "netgain_in_flight_requests", "x|", 2.0))
        rows.append(
            (t, "server:1", "netgain_thread_cpu_seconds_total", f"role={('prepost', 'device')[i % 2]}", t)
        )
    rows[7], rows[30] = rows[30], rows[7]
    schema = sample_schema()
    cols = list(zip(*rows, strict=True))
    table = pa.table({f.name: pa.array(c, f.type) for f, c in zip(schema, cols, strict=True)}, schema=schema)
    pq.write_table(table, tmp_path / "samples.parquet", row_group_size=4)
    arrays = load_samples(tmp_path)
    assert arrays is not None
    reference = with_ratios(table)
    assert reference.num_rows > table.num_rows  # ratios were derived
    for t0, t1 in ((-1.0, 100.0), (3.0, 14.5)):
        got = series(arrays, t0, t1)
        want = _series_by_lists(reference, t0, t1)
        assert list(got) == list(want)
        for metric, entries in want.items():
            assert [(k, list(t), list(v)) for k, t, v in got[metric]] == entries, metric
