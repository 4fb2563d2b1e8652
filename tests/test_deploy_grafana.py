"""deploy/grafana: provisioning and the dashboard's structure (its queries are proven against a
real Prometheus in test_deploy_prometheus.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "deploy" / "grafana"
DASH = json.loads((GRAFANA / "dashboards" / "netgain-soak.json").read_text())
PANELS: list[dict[str, Any]] = [p for p in DASH["panels"] if p["type"] != "row"]


def exprs(p: dict[str, Any]) -> str:
    return " ".join(t.get("expr", "") for t in p.get("targets", []))


def test_datasource_is_a_variable() -> None:
    """No fixed uid: panels and variables use ${datasource}, a datasource variable of type
    prometheus, so the dashboard imports as is into Grafana with another Prometheus (the
    kube-prometheus-stack's); provisioning here marks its datasource default, which the variable
    picks."""
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    (prom,) = [d for d in ds if d["type"] == "prometheus"]
    assert prom["isDefault"] is True
    (var,) = [v for v in DASH["templating"]["list"] if v["type"] == "datasource"]
    assert var["name"] == "datasource" and var["query"] == "prometheus"
    refs = [p["datasource"] for p in PANELS] + [t["datasource"] for p in PANELS for t in p["targets"]]
    refs += [v["datasource"] for v in DASH["templating"]["list"] if "datasource" in v]
    assert refs and all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs)
    assert prom["uid"] not in json.dumps(DASH)
    assert [d["name"] for d in prom["jsonData"]["exemplarTraceIdDestinations"]] == ["request_id"]


def test_ids_unique_and_layout_sane() -> None:
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids))
    for p in DASH["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0


def test_device_variable_and_server_panels_use_it() -> None:
    names = {v["name"] for v in DASH["templating"]["list"]}
    assert {"device", "model"} <= names
    for p in PANELS:
        e = exprs(p)
        if "netgain_" in e and "netgain_client" not in e and ":netgain_client" not in e:
            assert "$device" in e, f"panel {p['title']!r} ignores the device variable"


def test_topics_covered() -> None:
    def has(metric: str) -> list[str]:
        return [p["title"] for p in PANELS if metric in exprs(p)]

    for metric in (
        "netgain_client_latency_seconds_bucket",
        "netgain_request_duration_seconds_bucket",
        "netgain_phase_duration_seconds",
        "netgain_queue_depth_requests",
        "netgain_batch_size_items",
        "netgain_gpu_utilization_ratio",
        "netgain_gpu_sm_active_ratio",
        "netgain_gpu_memory_used_bytes",
        "netgain_gpu_power_watts",
        "netgain_kernel_busy_seconds_total",
        "netgain_device_instances",
        "netgain_thread_cpu_seconds_total",
        "process_cpu_seconds_total",
        "netgain_client_scheduled_requests_total",
        "netgain_requests_total",
        "netgain_client_requests_total",
        "netgain_cold_start_seconds",
        "netgain_client_send_lag_seconds",
        "netgain_client_dropped_total",
        "netgain_ready",
    ):
        assert has(metric), f"no panel shows {metric}"
    # GPU gauges beside the kernel busy ratio, in one panel
    assert set(has("netgain_gpu_utilization_ratio")) & set(has("netgain_kernel_busy_seconds_total"))
    # Prometheus conventions: rates are rate() of counters, never a *_rps or CPU-ratio gauge.
    gauges = ("_rps", "netgain_kernel_busy_ratio", "netgain_process_cpu_ratio", "netgain_thread_cpu_ratio")
    for gone in gauges:
        assert not has(gone), f"{has(gone)} read {gone}"
    stacked = [
        p
        for p in PANELS
        if "netgain_phase_duration_seconds" in exprs(p)
        and p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode") == "normal"
    ]
    assert stacked and stacked[0].get("repeat") == "device"


def test_exemplars_on_latency_panels() -> None:
    for p in PANELS:
        for t in p["targets"]:
            e = t.get("expr", "")
            if (
                "histogram_quantile" in e
                and ("latency_seconds" in e or "duration_seconds" in e)
                and ":" not in e
            ):
                assert t.get("exemplar") is True, f"{p['title']}/{t['refId']}: exemplars off"


def test_provider_path() -> None:
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "netgain.yml").read_text())
    assert prov["providers"][0]["type"] == "file"
