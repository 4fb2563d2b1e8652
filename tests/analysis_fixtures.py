"""Synthetic run directories whose right answers are known by construction.

Requests are scheduled at exactly ``rate`` per second (uniform spacing), so the measured window
holds ``rate * (duration - warmup)`` requests and successful throughput is known exactly. Each
request's latency is send_lag + network + the sum of its server phases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PHASES = ("queue", "pre", "h2d", "kernel", "d2h", "post")
BASE_MS = {"queue": 1.0, "pre": 2.0, "h2d": 0.0, "kernel": 5.0, "d2h": 0.0, "post": 0.5}


def meta_for(
    run_id: str,
    *,
    rate: float,
    duration_s: float,
    warmup_s: float,
    device: str,
    n: int,
    digest: str = "d" * 64,
    **over: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "schema": 1,
        "run_id": run_id,
        "command": ["netgain", "load"],
        "config": {
            "targets": ["127.0.0.1:50051"],
            "arrival": "poisson",
            "rate": rate,
            "duration_s": duration_s - warmup_s,
            "warmup_s": warmup_s,
            "workers": 2,
            "seed": 0,
            "mode": "open",
            "concurrency": 0,
            "max_in_flight": 1000,
            "timeout_s": 10.0,
            "max_send_lag_ms": 5.0,
            "slo_p99_ms": None,
            "max_error_rate": None,
            "price_per_hour": None,
        },
        "versions": {
            "client": {"python": "3.11.7"},
            "server": {
                "python": "3.11.7",
                "torch": "2.6.0",
                "cuda": "12.4" if device == "cuda" else None,
                "driver": "550.54" if device == "cuda" else None,
                "gpu": "NVIDIA H200" if device == "cuda" else None,
            },
        },
        "host": {"client": "c", "server": "s"},
        "server": {
            "model": "image",
            "device": device,
            "dtype": "float32",
            "intra_op_threads": 4,
            "batching": {
                "max_batch_size": 8,
                "max_queue_delay_ms": 2.0,
                "max_queue_size": 256,
                "instances": 1,
                "pre_threads": 2,
            },
            "cold_start": [
                {"name": "process_start", "at_s": 0.5, "duration_s": 0.5},
                {"name": "imports", "at_s": 1.5, "duration_s": 1.0},
                {"name": "ready", "at_s": 4.0, "duration_s": 2.5},
            ],
        },
        "trace": {
            "digest": digest,
            "source": f"synthetic:poisson rate={rate}",
            "requests": n,
            "duration_s": (n - 1) / rate,  # the last arrival, as netgain load writes it
            "mean_rate": rate,
        },
        "epoch_unix_ns": 1_796_216_484_050_000_000,
        "start_unix_s": 1796216484.05,
        "end_unix_s": 1796216516.3,
        "workers": {"expected": 2, "lost": []},
        "counts": {
            "scheduled": n,
            "sent": n,
            "answered": n,
            "ok": n,
            "errors": 0,
            "dropped": 0,
            "not_sent": 0,
            "worker_lost": 0,
        },
        "validity": {"valid": True, "reasons": []},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(meta.get(key), dict):
            meta[key] = {**meta[key], **value}
        else:
            meta[key] = value
    return meta


def make_run(
    path: Path,
    *,
    rate: float = 200.0,
    duration_s: float = 10.0,
    warmup_s: float = 2.0,
    device: str = "cpu",
    seed: int = 0,
    phases_ms: dict[str, float] | None = None,
    inflate: tuple[str, float, float] | None = None,
    network_ms: float = 0.3,
    send_lag_ms: float = 0.05,
    late: tuple[float, float] | None = None,
    statuses: dict[int, str] | None = None,
    batch_sizes: tuple[int, ...] = (1, 4),
    samples: dict[str, Any] | None = None,
    noise: float = 0.1,
    ids: bool = True,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write meta.json, requests.parquet and samples.parquet into ``path``.

    inflate: (phase, fraction, add_ms) adds add_ms to that phase on a random fraction of requests.
    late: (fraction, lag_ms) makes a fraction of sends that late.
    statuses: row index -> status name (errors have no done time phases; DROPPED/NOT_SENT no sent time).
    samples: metric -> value, or metric -> {labels: value}; a value may be a callable of t.
    """
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n = round(rate * duration_s)
    sched = (np.arange(n) * (1e9 / rate)).astype(np.int64)
    base = {**BASE_MS, **(phases_ms or {})}
    ph = {p: np.full(n, base[p]) * (1 + noise * rng.random(n)) for p in PHASES}
    if inflate:
        phase, frac, add = inflate
        hit = rng.random(n) < frac
        ph[phase][hit] += add
    lag = np.full(n, send_lag_ms)
    if late:
        lag[rng.random(n) < late[0]] = late[1]
    total = sum(ph[p] for p in PHASES)
    net = np.full(n, network_ms)
    sent = sched + (lag * 1e6).astype(np.int64)
    done = sent + ((total + net) * 1e6).astype(np.int64)
    status = np.array(["OK"] * n, dtype=object)
    sent_l: list[int | None] = sent.tolist()
    done_l: list[int | None] = done.tolist()
    phase_l = {p: ph[p].tolist() for p in PHASES}
    total_l: list[float | None] = total.tolist()
    for i, s in (statuses or {}).items():
        status[i] = s
        if s in ("DROPPED", "NOT_SENT"):
            sent_l[i] = done_l[i] = None
        if s != "OK":
            total_l[i] = None
            for p in PHASES:
                phase_l[p][i] = None
    bs = np.array(batch_sizes)[rng.integers(0, len(batch_sizes), n)]
    cols: dict[str, Any] = {
        "index": pa.array(np.arange(n), pa.int64()),
        "request_id": pa.array([f"r{i:08d}" for i in range(n)] if ids else [""] * n, pa.string()),
        "worker": pa.array(np.arange(n) % 2, pa.int32()),
        "target": pa.array(["127.0.0.1:50051"] * n),
        "warmup": pa.array(sched < warmup_s * 1e9),
        "scheduled_ns": pa.array(sched, pa.int64()),
        "sent_ns": pa.array(sent_l, pa.int64()),
        "done_ns": pa.array(done_l, pa.int64()),
        "status": pa.array(status.tolist(), pa.string()),
        "items": pa.array(np.ones(n), pa.int32()),
        "request_bytes": pa.array(np.full(n, 100), pa.int64()),
        "response_bytes": pa.array(np.full(n, 10), pa.int64()),
        "batch_id": pa.array(np.arange(n) // 2, pa.int64()),
        "batch_size": pa.array(bs, pa.int32()),
    }
    for p in PHASES:
        cols[f"{p}_ms"] = pa.array(phase_l[p], pa.float64())
    cols["server_total_ms"] = pa.array(total_l, pa.float64())
    pq.write_table(pa.table(cols), path / "requests.parquet")
    write_samples(path, duration_s, samples or {})
    m = meta_for(
        path.name, rate=rate, duration_s=duration_s, warmup_s=warmup_s, device=device, n=n, **(meta or {})
    )
    (path / "meta.json").write_text(json.dumps(m))
    return path


def write_samples(path: Path, duration_s: float, spec: dict[str, Any]) -> None:
    rows: dict[str, list[Any]] = {"t_s": [], "source": [], "metric": [], "labels": [], "value": []}
    for t in np.arange(0.0, duration_s + 1e-9, 1.0):
        for metric, v in spec.items():
            series = v if isinstance(v, dict) else {"": v}
            for labels, val in series.items():
                src = "worker:0" if metric == "netgain_client_worker_cpu_ratio" else "server:127.0.0.1:50051"
                host = metric.startswith(("netgain_host_", "netgain_loadgen_"))
                src = "host" if host else src  # the load generator's host readings
                lab = ",".join(x for x in ("" if host else "model=image", labels) if x)
                rows["t_s"].append(float(t))
                rows["source"].append(src)
                rows["metric"].append(metric)
                rows["labels"].append(lab)
                rows["value"].append(float(val(t) if callable(val) else val))
    pq.write_table(
        pa.table(
            {
                "t_s": pa.array(rows["t_s"], pa.float64()),
                "source": pa.array(rows["source"], pa.string()),
                "metric": pa.array(rows["metric"], pa.string()),
                "labels": pa.array(rows["labels"], pa.string()),
                "value": pa.array(rows["value"], pa.float64()),
            }
        ),
        path / "samples.parquet",
    )


def span_log(path: Path, run: Path, *, skip: set[int] = frozenset(), extra: int = 0) -> Path:  # type: ignore[assignment]
    """Span-log JSONL for the run's requests, leaving out ``skip`` rows and adding ``extra`` unknown ids."""
    t = pq.read_table(run / "requests.parquet")
    ids = t.column("request_id").to_pylist()
    with path.open("w") as fh:
        for i, rid in enumerate(ids):
            if i in skip:
                continue
            rec = {
                "id": rid,
                "code": "OK",
                "batch_id": i // 2,
                "batch_size": 2,
                "items": 1,
                "arrival_unix_ns": 0,
                "total_ms": 9.0,
                **{f"{p}_ms": 1.5 for p in PHASES},
            }
            fh.write(json.dumps(rec) + "\n")
        for j in range(extra):
            fh.write(json.dumps({"id": f"ghost{j}", "code": "OK", "total_ms": 1.0}) + "\n")
    return path
