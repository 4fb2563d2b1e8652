"""The HTML report in a real headless browser (Chromium): rendered tables, and charts whose text
fits.

The test's copy of each report gets a script that measures, after layout, every SVG ``<text>``,
legend entry and plot area (``getBoundingClientRect``) and writes them as JSON into
``document.body.dataset.layout``; ``chromium --dump-dom`` returns the DOM with it. A text that
leaves its SVG's box (clipped), two texts that overlap, a legend entry on the plot or on another
entry fails the test. A screenshot of the whole page must come out at the page's size and not blank.
``.ci/run`` installs Debian's ``chromium``; without a Chromium binary the test is skipped.
"""

from __future__ import annotations

import html
import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import make_run
from PIL import Image

from netgain.analysis import build_report, write_outputs
from netgain.analysis.crossover import crossover
from netgain.loadgen.traces import inspect_trace, synthesize
from netgain.loadgen.traces.render import svg_plot

BROWSERS = (
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
    "chrome",
    "headless_shell",
)
CHROMIUM = os.environ.get("NETGAIN_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")

WIDTH = 1280
TOL = 0.5  # px: anti-aliasing and rounding, not a layout error

PROBE = """<script>
(() => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {x: r.left, y: r.top, w: r.width, h: r.height}; };
  const words = (el) => [...el.childNodes].filter((n) => n.nodeName !== "title")
    .map((n) => n.textContent).join(" ").trim();
  const svgs = [...document.querySelectorAll("svg")].map((s) => ({
    box: box(s),
    title: words(s.querySelector("text") || s),
    texts: [...s.querySelectorAll("text")].filter((t) => words(t))
      .map((t) => ({text: words(t), ...box(t)})),
    legend: [...s.querySelectorAll(".legend-entry")]
      .map((g) => ({text: words(g.querySelector("text")), ...box(g)})),
    plots: [...s.querySelectorAll(".plot")].map(box),
  }));
  const tables = [...document.querySelectorAll("table")].map((t) => ({
    head: [...t.querySelectorAll("thead th")].map((c) => c.textContent),
    rows: t.querySelectorAll("tbody tr").length,
    width: t.getBoundingClientRect().width,
  }));
  const pres = [...document.querySelectorAll("pre")].map((p) => p.textContent);
  document.body.dataset.layout = JSON.stringify({
    svgs, tables, pres, height: document.documentElement.scrollHeight,
    width: document.documentElement.scrollWidth,
  });
})();
</script>"""


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--hide-scrollbars",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp / 'profile'}",
        *args,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, check=True, env={**os.environ, "HOME": str(tmp)}
    )


def _reports(root: Path) -> dict[str, dict[str, Any]]:
    samples = {
        "netgain_gpu_utilization_ratio": lambda t: 0.4 + 0.05 * t,
        "netgain_process_cpu_ratio": 1.2,
        "netgain_thread_cpu_ratio": {"role=pre": 0.8, "role=batcher": 0.3, "role=grpc": 0.2},
        "netgain_queue_depth_requests": lambda t: 3 + t,
    }
    kw: dict[str, Any] = {"rate": 400.0, "duration_s": 6.0, "warmup_s": 1.0, "samples": samples}
    cpu = make_run(root / "cpu", phases_ms={"kernel": 20.0}, **kw)
    gpu = make_run(
        root / "gpu",
        device="cuda",
        phases_ms={"kernel": 2.0, "h2d": 0.5},
        inflate=("queue", 0.02, 30.0),
        **kw,
    )
    sweep: list[str | Path] = [
        make_run(
            root / f"sweep{rate}",
            rate=float(rate),
            duration_s=4.0,
            warmup_s=1.0,
            device="cuda",
            phases_ms={"queue": q},
            batch_sizes=(b,),
        )
        for rate, q, b in ((100, 1.0, 1), (200, 5.0, 4), (400, 80.0, 16))
    ]
    compare = build_report(
        gpu,
        baseline_dir=cpu,
        price_per_hour=3.5,
        baseline_price_per_hour=0.68,
        slo_p99_ms=100.0,
        bootstrap=20,
    )
    # as netgain compare adds it: the crossover chart is drawn into the same page
    sides = {
        "baseline": {"capacity_rps": 60.0, "price_per_hour": 0.68, "device": "cpu"},
        "treatment": {"capacity_rps": 500.0, "price_per_hour": 3.5, "device": "cuda"},
    }
    compare["crossover"] = crossover([50, 100, 200, 400], sides, slo_p99_ms=100.0)
    return {
        "compare": compare,
        "sweep": build_report(sweep[0], sweep_dirs=sweep, slo_p99_ms=50.0, price_per_hour=3.6, bootstrap=0),
    }


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each report's HTML as written by write_outputs, and the layout Chromium measured."""
    root = tmp_path_factory.mktemp("browser")
    trace = synthesize("gamma", 200.0, 30.0, seed=3, cv=3.0, size_bytes=2000, size_sigma=1.0, items="1:4,4:1")
    trace_svg = svg_plot(trace, inspect_trace(trace))
    out: dict[str, dict[str, Any]] = {}
    for name, report in _reports(root / "runs").items():
        dest = root / name
        dest.mkdir()
        page = write_outputs(report, dest)[2]
        text = page.read_text()
        # the test's copy: the trace plot (same SVG primitives) too, then the probe
        extra = f"<figure>{trace_svg}</figure>" if name == "compare" else ""
        probe = dest / "probe.html"
        probe.write_text(text.replace("</body>", extra + PROBE + "</body>"))
        dom = _chromium(dest, f"--window-size={WIDTH},1000", "--dump-dom", probe.as_uri()).stdout
        m = re.search(r'data-layout="([^"]*)"', dom)
        assert m, f"the probe wrote no layout: {dom[:500]}"
        layout = json.loads(html.unescape(m.group(1)))
        out[name] = {"html": text, "layout": layout, "page": page, "dir": dest}
    return out


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    w = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])
    h = min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"])
    return w > TOL and h > TOL


def _inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
    return (
        inner["x"] >= outer["x"] - TOL
        and inner["y"] >= outer["y"] - TOL
        and inner["x"] + inner["w"] <= outer["x"] + outer["w"] + TOL
        and inner["y"] + inner["h"] <= outer["y"] + outer["h"] + TOL
    )


@pytest.mark.parametrize("name", ["compare", "sweep"])
def test_chart_text_fits_and_does_not_overlap(pages: dict[str, dict[str, Any]], name: str) -> None:
    svgs = pages[name]["layout"]["svgs"]
    assert len(svgs) >= (10 if name == "compare" else 6)
    problems = []
    for s in svgs:
        where = f"chart {s['title']!r}"
        problems += [f"{where}: {t['text']!r} leaves the SVG" for t in s["texts"] if not _inside(t, s["box"])]
        problems += [
            f"{where}: {a['text']!r} overlaps {b['text']!r}"
            for a, b in itertools.combinations(s["texts"], 2)
            if _overlap(a, b)
        ]
        problems += [
            f"{where}: legend entry {e['text']!r} on the plot"
            for e in s["legend"]
            for p in s["plots"]
            if _overlap(e, p)
        ]
        problems += [
            f"{where}: legend entries {a['text']!r} and {b['text']!r} overlap"
            for a, b in itertools.combinations(s["legend"], 2)
            if _overlap(a, b)
        ]
        problems += [
            f"{where}: legend entry {e['text']!r} clipped" for e in s["legend"] if not _inside(e, s["box"])
        ]
    assert not problems, "\n".join(problems)
    assert sum(len(s["legend"]) for s in svgs) >= 6  # the legends were measured


@pytest.mark.parametrize("name", ["compare", "sweep"])
def test_report_is_html_not_markdown(pages: dict[str, dict[str, Any]], name: str) -> None:
    page = pages[name]
    layout, text = page["layout"], page["html"]
    tables = layout["tables"]
    assert len(tables) >= 5 and all(t["rows"] >= 1 and t["head"] and t["width"] > 50 for t in tables)
    heads = [t["head"] for t in tables]
    assert ["", "p50", "p90", "p95", "p99", "p99.9", "max"] in heads
    assert ["phase", "mean", "p50", "p90", "p99", "max"] in heads
    if name == "compare":
        assert ["metric", "ratio", "95% CI"] in heads
    else:
        assert ["run", "offered rps", "ok rps", "p99 ms", "batch mean", "valid"] in heads
        assert next(t for t in tables if t["head"][0] == "run")["rows"] == 3
    assert not layout["pres"], "no <pre> blocks: the report is rendered, not Markdown in a box"
    assert "|---" not in text and "**" not in text and "<h2>" in text and "class='verdict" in text
    assert layout["width"] <= WIDTH, "nothing wider than the window (no horizontal scrolling)"
    # self-contained: no external resources
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")


def test_screenshot(pages: dict[str, dict[str, Any]]) -> None:
    page = pages["compare"]
    height = min(int(page["layout"]["height"]), 16000)
    png = page["dir"] / "report.png"
    _chromium(page["dir"], f"--window-size={WIDTH},{height}", f"--screenshot={png}", page["page"].as_uri())
    with Image.open(png) as im:
        assert im.size == (WIDTH, height)
        colors = im.convert("RGB").resize((64, 64)).getcolors(64 * 64)
        assert colors is not None and len(colors) > 8, "the screenshot is blank"
