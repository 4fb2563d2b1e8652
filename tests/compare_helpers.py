"""A small CPU-against-CPU compare configuration on the null model, for the tests of compare's steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from netgain.experiments.cpu_vs_gpu import CompareConfig, Side


def cpu_vs_cpu(tmp_path: Path, **overrides: Any) -> CompareConfig:
    """One batch size, no fixed rates (search), the treatment priced at twice the baseline."""
    fields: dict[str, Any] = {
        "model": "null", "traffic": ["--rate", "50"], "duration_s": 5, "warmup_s": 1,
        "batch_sizes": [1], "items": [1], "rates": [], "sweep_duration_s": 5, "slo_p99_ms": 100.0,
        "workers": 1, "out": str(tmp_path),
        "baseline": Side("baseline", "cpu", 1.0), "treatment": Side("treatment", "cpu", 2.0),
    }  # fmt: skip
    fields.update(overrides)
    return CompareConfig(**fields)
