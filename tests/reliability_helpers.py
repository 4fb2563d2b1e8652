"""Helpers shared by the reliability tests and benchmarks (no tests here).

Payload crafting (truncated and bomb images), metric scraping, an RSS sampler and a
`netgain load` runner that reads the run directory back.
"""

from __future__ import annotations

import contextlib
import io
import math
import random
import struct
import subprocess
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from conftest import netgain_cmd
from prometheus_client.parser import text_string_to_metric_families

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
MB = 1024 * 1024


# -- payloads --------------------------------------------------------------------------------
def png_chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def png_bomb(width: int, height: int, real_rows: int = 0) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` (8-bit grayscale). With ``real_rows`` > 0
    its IDAT holds that many real zero rows, compressed (a small file that inflates to a lot);
    otherwise a tiny IDAT: the declared size alone must get it rejected before any decoding."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    if real_rows:
        comp = zlib.compressobj(9)
        row = b"\x00" * (width + 1)  # filter byte + pixels
        body = b"".join(comp.compress(row) for _ in range(real_rows)) + comp.flush()
    else:
        body = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", body) + png_chunk(b"IEND", b"")
    )


def encoded_image(fmt: str, side: int = 48, seed: int = 0) -> bytes:
    from PIL import Image

    gen = np.random.default_rng(seed)
    pixels = gen.integers(0, 255, size=(side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format=fmt)
    return buf.getvalue()


def jpeg_with_declared_size(width: int, height: int) -> bytes:
    """A valid small JPEG whose SOF marker is rewritten to declare ``width`` x ``height``."""
    data = bytearray(encoded_image("JPEG", 16))
    i = 2
    while i < len(data) - 9:
        if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2):
            struct.pack_into(">HH", data, i + 5, height, width)
            return bytes(data)
        i += 1
    raise AssertionError("no SOF marker in the JPEG")


# -- metrics ---------------------------------------------------------------------------------
def counter_values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``name`` (a counter, without ``_total``) as {sorted label items: value}."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name + "_total":
                out[tuple(sorted(s.labels.items()))] = float(s.value)
    return out


def requests_by_code(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in counter_values(text, "netgain_requests").items():
        code = dict(labels)["code"]
        out[code] = out.get(code, 0.0) + value
    return out


def gauge_value(text: str, name: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return float(s.value)
    return float("nan")


def wait_for_counts(scrape: Any, expect: dict[str, float], timeout_s: float = 10.0) -> dict[str, float]:
    """Scrape until every code in ``expect`` reaches its count (the recorder thread is asynchronous)."""
    end = time.monotonic() + timeout_s
    while True:
        got = requests_by_code(scrape())
        if all(got.get(k, 0.0) >= v for k, v in expect.items()) or time.monotonic() > end:
            return got
        time.sleep(0.1)


# -- processes -------------------------------------------------------------------------------
class RssSampler:
    """Samples a process's RSS (MB) every ``interval_s`` on a thread, between start() and stop()."""

    def __init__(self, pid: int, interval_s: float = 0.2, scrape: Any = None) -> None:
        self.proc = psutil.Process(pid)
        self.interval_s = interval_s
        self.rss_mb: list[float] = []
        self.queue_depth: list[float] = []
        self._scrape = scrape
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.rss_mb.append(self.proc.memory_info().rss / MB)
            except psutil.Error:
                return
            if self._scrape is not None:
                with contextlib.suppress(OSError):
                    depth = gauge_value(self._scrape(), "netgain_queue_depth_requests")
                    if math.isfinite(depth):  # absent until the server is ready
                        self.queue_depth.append(depth)
            self._stop.wait(self.interval_s)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def write_trace(path: Path, phases: list[tuple[float, float]], seed: int = 0) -> tuple[list[int], str]:
    """A CSV trace of constant-rate phases [(rate, seconds), ...]. Returns the rows of each phase and
    the trace's duration (its last arrival) as a string for `--duration`: a longer one would loop it."""
    rng = random.Random(seed)
    lines = ["t,size,items"]
    start = 0.0
    counts: list[int] = []
    last = "0"
    for rate, seconds in phases:
        step = 1.0 / rate
        t = start + rng.uniform(0, step)
        n = 0
        while t < start + seconds:
            last = f"{t:.6f}"
            lines.append(f"{last},0,1")
            t += step
            n += 1
        counts.append(n)
        start += seconds
    path.write_text("\n".join(lines) + "\n")
    return counts, last


def accounted(counts: dict[str, int]) -> int:
    return sum(int(counts[k]) for k in ("ok", "errors", "dropped", "not_sent", "worker_lost"))


def run_load(env: dict[str, str], *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        netgain_cmd("load", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
        cwd=REPO_ROOT,
    )


def overload_summary(rows: dict[str, np.ndarray], n_spike: int, ok_bound_ms: float) -> dict[str, Any]:
    """Figures of a spike-then-normal run (rows in schedule order: the first ``n_spike`` are the spike).

    ``recovery_s``: from the first post-spike request's scheduled time to the first request after
    which every request is OK within ``ok_bound_ms``."""
    order = np.argsort(rows["index"])
    status = rows["status"][order]
    sched = rows["scheduled_ns"][order].astype(np.int64)
    done = rows["done_ns"][order]
    lat_ms = np.array(
        [
            (d - s) / 1e6 if d is not None and not _isnan(d) else np.nan
            for d, s in zip(done, sched, strict=True)
        ]
    )
    spike, after = slice(0, n_spike), slice(n_spike, None)
    ok_spike = status[spike] == "OK"
    good_after = (status[after] == "OK") & (lat_ms[after] <= ok_bound_ms)
    bad_idx = np.flatnonzero(~good_after)
    if bad_idx.size == 0:
        recovery_s = 0.0
    elif bad_idx[-1] + 1 < good_after.size:
        recovery_s = float(sched[n_spike + bad_idx[-1] + 1] - sched[n_spike]) / 1e9
    else:
        recovery_s = float("inf")
    spike_codes: dict[str, int] = {}
    for code in status[spike]:
        spike_codes[str(code)] = spike_codes.get(str(code), 0) + 1
    return {
        "spike_requests": n_spike,
        "spike_codes": spike_codes,
        "shed": int((status[spike] == "RESOURCE_EXHAUSTED").sum()),
        "accepted": int(ok_spike.sum()),
        "accepted_p50_ms": float(np.percentile(lat_ms[spike][ok_spike], 50))
        if ok_spike.any()
        else float("nan"),
        "accepted_p99_ms": float(np.percentile(lat_ms[spike][ok_spike], 99))
        if ok_spike.any()
        else float("nan"),
        "accepted_max_ms": float(np.max(lat_ms[spike][ok_spike])) if ok_spike.any() else float("nan"),
        "after_requests": int(good_after.size),
        "after_ok": int((status[after] == "OK").sum()),
        "after_p99_ms": float(np.nanpercentile(lat_ms[after], 99)) if good_after.size else float("nan"),
        "recovery_s": recovery_s,
    }


def _isnan(x: Any) -> bool:
    try:
        return bool(np.isnan(x))
    except TypeError:
        return False
