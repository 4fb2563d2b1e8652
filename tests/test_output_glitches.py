"""What the commands print reads as words and numbers a user can act on: no internal prefixes, no
float noise, nothing said twice, no dangling separators, no mark left unexplained, no axis with one
label, no raw metric names in a legend, and hints that name the file the user gave."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import make_run
from conftest import REPO_ROOT
from conftest import run_netgain as netgain

from netgain.analysis.crossover import crossover, line
from netgain.analysis.render_html import util_plot
from netgain.analysis.render_text import num, render_markdown
from netgain.analysis.run_summary import analyze
from netgain.analysis.tail import phase_matrix
from netgain.charts.svg import log_ticks
from netgain.contract.phases import PHASES
from netgain.experiments.tune import Knobs, Result, Trial, table
from netgain.loadgen.traces import TraceError, read_trace


def _same_instants_csv(path: Path) -> None:
    """Pairs of requests at one instant, written as floats that differ in their last bit."""
    rows = ["t"]
    for k in range(100):
        a = k * 0.1
        rows += [repr(a), repr(float(np.nextafter(a, 1e9)))]
    path.write_text("\n".join(rows) + "\n")


def test_trace_inspect_names_the_file_and_bins_same_instant_gaps_as_zero(tmp_path: Path) -> None:
    """`netgain trace inspect traffic.csv` heads its summary with the file, not `file:`, and gaps
    below a nanosecond (one instant written twice) count as 0 ms, not a 1e-12 ms bin."""
    trace = tmp_path / "traffic.csv"
    _same_instants_csv(trace)
    res = netgain("trace", "inspect", str(trace))
    assert res.returncode == 0, res.stderr
    assert f"trace {trace}" in res.stdout and "file:" not in res.stdout
    gaps = res.stdout.split("inter-arrival times:")[1].split("\n\n")[0]
    assert "e-1" not in gaps and "0 ms |" in gaps, gaps


def test_bad_column_hint_names_the_file_given(tmp_path: Path) -> None:
    """The `netgain trace import` hint for a size-like column names the path the user gave."""
    (tmp_path / "sub").mkdir()
    bad = tmp_path / "sub" / "my log.csv"
    bad.write_text("t,size_bytes\n0.0,10\n0.5,20\n")
    with pytest.raises(TraceError) as err:
        read_trace(str(bad))
    assert f"netgain trace import '{bad}' --time-column" in str(err.value)


def test_the_other_phase_is_zero_not_float_noise() -> None:
    """A server total equal to its phases' sum leaves `other` 0, not -5.55e-17; tiny noise prints 0."""
    n = 4
    phases = {p: np.zeros(n) for p in PHASES}
    phases["queue"], phases["pre"] = np.full(n, 0.1), np.full(n, 0.2)
    m = phase_matrix(phases, np.full(n, 0.3), np.full(n, 1.0), np.zeros(n))
    assert (m["other"] == 0.0).all()
    assert num(-2.16e-17) == "0.000" and num(0.0004) == "0.0004"


def test_crossover_not_within_rates_is_said_once_and_its_axis_has_two_labels() -> None:
    """The crossover line says "not within the rates tried" once; a narrow cost range still gets
    at least two tick labels on its log axis."""
    sides = {
        "baseline": {"device": "cpu", "capacity_rps": 100.0, "price_per_hour": 1.0, "runs": 5},
        "treatment": {"device": "cuda", "capacity_rps": 200.0, "price_per_hour": 3.0, "runs": 5},
    }
    text = line(crossover([50.0, 100.0, 200.0], sides))
    assert text.startswith("CROSSOVER: not within the rates tried (") and text.count("not within") == 1
    assert len(log_ticks(math.log10(0.0024), math.log10(0.005))) >= 2


def test_markdown_report_has_no_dangling_separator(tmp_path: Path) -> None:
    """No line of report.md ends in `;` (a cost line without a note used to end in `; `)."""
    run = make_run(tmp_path / "run", rate=50.0, duration_s=3.0, warmup_s=0.5)
    r = analyze(run, price_per_hour=1.0, slo_p99_ms=100.0).report
    assert r["cost"].get("note") in (None, "")  # the case that left the separator
    for text in render_markdown(r).splitlines():
        assert not text.rstrip().endswith(";"), text


def test_tune_table_explains_its_mark() -> None:
    """The `*` beside the best configuration's capacity is explained under the table."""
    held = Trial(120.0, 120.0, 5.0, 50.0, 0, 0.0, True, "unsaturated", True)
    out = table([Result(knobs=Knobs(), trials=[held]), Result(knobs=Knobs(max_batch_size=32))])
    assert " *" in out and out.splitlines()[-1].startswith("* the best configuration")


def test_utilization_legend_in_words() -> None:
    """The utilization chart's legend names what was measured, not netgain's metric names."""
    series = {
        "utilization": {
            "kernel_busy_ratio": [[0.0, 0.1], [1.0, 0.2]],
            "process_cpu_ratio": [[0.0, 0.5], [1.0, 0.6]],
            "thread_cpu_ratio[frontend]": [[0.0, 0.1], [1.0, 0.1]],
        }
    }
    svg = util_plot({"series": series}, "run")
    assert "_ratio" not in svg
    assert "device busy (kernel spans)" in svg and "frontend threads CPU (cores)" in svg


def test_readme_links_install_and_runbooks() -> None:
    """README links the install page, both runbooks and the reliability page."""
    readme = (REPO_ROOT / "README.md").read_text()
    for page in ("install.md", "runbook-soak.md", "runbook-scale-up-drill.md", "reliability.md"):
        assert re.search(rf"\]\(docs/{re.escape(page)}\)", readme), page
