"""Cost per 1k and the autoscaling replay with hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest

from netgain.analysis import cost


def test_cost_per_1k_exact() -> None:
    # $3.60/h at 100 ok/s: 360,000 requests per hour -> $0.01 per 1,000
    assert cost.cost_per_1k(3.6, 100.0) == pytest.approx(0.01)
    assert cost.cost_per_1k(None, 100.0) is None
    assert cost.cost_per_1k(1.0, 0.0) is None


def test_cold_start_is_last_phase_end() -> None:
    meta = {
        "server": {
            "cold_start": [
                {"name": "a", "at_s": 0.5, "duration_s": 0.5},
                {"name": "ready", "at_s": 7.25, "duration_s": 6.75},
            ]
        }
    }
    assert cost.cold_start_s(meta) == 7.25
    assert cost.cold_start_s({"server": {"cold_start": [{"name": "x", "duration_s": 2.0}]}}) == 2.0
    assert cost.cold_start_s({}) is None


def test_arrival_rate_bins() -> None:
    s = np.array([0.1, 0.2, 1.5, 9.99])
    assert cost.arrival_rate(s, 1.0, 10.0).tolist() == [2, 1, 0, 0, 0, 0, 0, 0, 0, 1]


def test_autoscale_steady_traffic_costs_like_steady_state() -> None:
    rate = np.full(100, 50.0)
    a = cost.autoscale(rate, capacity_rps=100.0, cold_start_s=10.0, price_per_hour=3.6, min_replicas=1)
    assert a["instance_seconds"] == 100 and a["busy_instance_seconds"] == 50
    assert a["idle_instance_seconds"] == 50 and a["slo_violation_s"] == 0
    # 100 instance-s at $0.001/s = $0.1 for 5,000 requests -> $0.02 per 1k
    assert a["cost"] == pytest.approx(0.1) and a["cost_per_1k"] == pytest.approx(0.02)
    assert a["idle_cost"] == pytest.approx(0.05)


def test_autoscale_spike_pays_cold_start_in_violations() -> None:
    rate = np.array([10.0] * 10 + [250.0] * 10 + [10.0] * 10)
    a = cost.autoscale(
        rate, capacity_rps=100.0, cold_start_s=3.0, price_per_hour=3.6, min_replicas=1, scale_down_after_s=2.0
    )
    # spike at t=10 wants 3 replicas; 2 more start at 10, ready at 13: t=10,11,12 are short
    assert a["ready"][10:14] == [1, 1, 1, 3]
    assert a["replicas"][10] == 3 and a["max_replicas"] == 3
    assert a["slo_violation_s"] == 3
    assert a["requests_over_capacity"] == pytest.approx(3 * 150.0)
    # scale-down after 2 s of lower demand: spike ends at 20, back to 1 replica at t=22
    assert a["replicas"][20:23] == [3, 3, 1]
    assert a["instance_seconds"] == 10 * 1 + 10 * 3 + 2 * 3 + 8 * 1


def test_autoscale_needs_capacity() -> None:
    with pytest.raises(ValueError):
        cost.autoscale(np.ones(3), capacity_rps=0.0, cold_start_s=1.0, price_per_hour=1.0)


def test_capacity_from_points_picks_best_valid_run_meeting_slo() -> None:
    pts = [
        {"run_dir": "a", "throughput_rps": 100.0, "p99_ms": 20.0, "error_rate": 0.0, "valid": True},
        {"run_dir": "b", "throughput_rps": 200.0, "p99_ms": 45.0, "error_rate": 0.0, "valid": True},
        {"run_dir": "c", "throughput_rps": 300.0, "p99_ms": 80.0, "error_rate": 0.0, "valid": True},
        {"run_dir": "d", "throughput_rps": 250.0, "p99_ms": 30.0, "error_rate": 0.0, "valid": False},
    ]
    c = cost.capacity_from_points(pts, 50.0)
    assert (c["capacity_rps"], c["from_run"], c["runs_meeting_slo"]) == (200.0, "b", 2)
    assert cost.capacity_from_points(pts, 10.0)["capacity_rps"] is None
