"""compare's NEXT lines read held and missed by the search's own rule (``tune.trial``): a sweep run
whose p99 met the SLO but whose errors passed the bound is a miss, and its bottleneck is the one
named."""

from __future__ import annotations

from pathlib import Path

import pytest
from compare_helpers import cpu_vs_cpu

from netgain.experiments import compare_price
from netgain.experiments.capacity import Trial
from netgain.experiments.compare_price import limit_lines, limits_of
from netgain.experiments.cpu_vs_gpu import CompareConfig


def test_a_step_that_shed_requests_within_the_slo_is_the_first_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rate -> (p99 ms, error ratio): 400 held; 800 met p99 but shed 2 %; 1600 missed p99
    figures = {400.0: (20.0, 0.0), 800.0: (60.0, 0.02), 1600.0: (900.0, 0.0)}

    def trial(cfg: CompareConfig, run_dir: str, rate: float) -> Trial:
        p99, ratio = figures[rate]
        held = p99 <= cfg.slo_p99_ms and ratio <= cfg.max_error_ratio
        kind = "queue-full" if run_dir.endswith("r800") else "cpu-bound"
        levers = ((kind, f"act on {kind}"),)
        return Trial(rate, rate, p99 / 2, p99, int(ratio * 1000), ratio, True, kind, held, levers)

    monkeypatch.setattr(compare_price, "step_trial", trial)
    monkeypatch.setattr(compare_price, "_done", lambda run_dir: True)
    side = {"sweep": [str(tmp_path / f"r{r:g}") for r in figures], "sweep_rates": list(figures)}
    limits = limits_of(cpu_vs_cpu(tmp_path), {"baseline": side, "treatment": side})
    for lim in limits:
        assert lim["held_rates"] == [400.0] and not lim["held_every_rate"]
        assert lim["rate"] == 800.0 and lim["kinds"][0]["kind"] == "queue-full"
        # It says which rule the step broke: errors alone, its p99 within the SLO.
        assert lim["why"] == "2.00% of requests failed, over the 0.10% bound; p99 60.0 ms held"
    assert limit_lines(limits)[0] == (
        "NEXT baseline (cpu): first missed at 800 req/s (2.00% of requests failed, over the 0.10% "
        "bound; p99 60.0 ms held), queue-full: act on queue-full"
    )


def test_a_miss_on_latency_names_its_p99_and_an_invalid_run_says_so() -> None:
    slow = Trial(800.0, 790.0, 40.0, 161.5, 0, 0.0, True, "x", False)
    assert compare_price.miss_reason(slow, 100.0, 1e-3) == "p99 161.5 ms over 100"
    invalid = Trial(800.0, 500.0, 40.0, 90.0, 0, 0.0, False, "x", False)
    assert compare_price.miss_reason(invalid, 100.0, 1e-3) == "the run was invalid; p99 90.0 ms held"
