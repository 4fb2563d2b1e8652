"""meta.json of a run: the configuration, versions, hosts, the servers' info, the trace, the
workers, the counts and the validity verdict."""

from __future__ import annotations

import os
import platform
import socket
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import grpc

from netgain.contract import rundir as files
from netgain.contract.cores import cpu_list
from netgain.loadgen.runner.config import LoadConfig

if TYPE_CHECKING:
    from netgain.loadgen.runner.master import Master


def build_meta(
    cfg: LoadConfig, master: Master, infos: list[Any], model: str, counts: dict[str, int], reasons: list[str]
) -> dict[str, Any]:
    import locust
    from google.protobuf.json_format import MessageToDict

    server = MessageToDict(infos[0], preserving_proto_field_name=True) if infos else {}
    config = asdict(cfg)
    config.pop("command", None)
    config.update(
        rate=len(master.schedule) / max(1e-9, cfg.warmup_s + cfg.duration_s),
        model=model,
        arrival=master.schedule.source,
        # The ports bound (-1: not served), so a port given as 0 can be found; the flags as given too.
        metrics_port=master.metrics_port,
        metrics_port_requested=cfg.metrics_port,
        web_port=master.web_port,
        web_port_requested=cfg.web_port,
    )
    if cfg.request_template is not None:
        config["request_template"] = redacted(cfg.request_template)
    client = {
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "locust": getattr(locust, "__version__", ""),
        "netgain": _version("netgain"),
    }
    if cfg.protocol in ("oip-http", "http-json"):
        client["geventhttpclient"] = _version("geventhttpclient")  # its parser reads the answers
    return {
        "schema": files.SCHEMA_VERSION,
        "run_id": master.run_id,
        "command": cfg.command,
        "config": config,
        "versions": {
            "client": client,
            "server": server.get("versions", {}),
        },
        "host": {
            "client": socket.gethostname(),
            "server": server.get("host", ""),
            "client_cpus": cpu_list(sorted(os.sched_getaffinity(0))),  # local workers inherit them
        },
        "server": server,
        "targets": [MessageToDict(i, preserving_proto_field_name=True) for i in infos[1:]],
        "trace": {
            "digest": master.schedule.digest,
            "source": master.schedule.source,
            "requests": len(master.schedule),
            "duration_s": master.schedule.duration_s,
            "mean_rate": len(master.schedule) / max(1e-9, master.schedule.duration_s),
        },
        "epoch_unix_ns": master.epoch_ns,
        "start_unix_s": master.epoch_ns / 1e9,
        "end_unix_s": getattr(master, "end_unix_s", time.time()),
        "workers": {
            "expected": master.workers.total,
            "lost": sorted(master.workers.lost),
            "cpu_ratio": master.workers.cpu(),
        },
        "counts": counts,
        "validity": {"valid": not reasons, "reasons": reasons},
        # seconds since the epoch of the Ctrl-C that stopped the run; absent for a run that ran out
        **({"interrupted_at_s": master.interrupted_at} if master.interrupted_at is not None else {}),
    }


#: Header values a run directory does not keep (they are credentials).
SECRET_HEADERS = ("authorization", "proxy-authorization", "cookie", "x-api-key", "api-key")


def redacted(template: dict[str, Any]) -> dict[str, Any]:
    """A request template as meta.json keeps it: credentials' values replaced by ``<redacted>``."""
    headers = template.get("headers") or {}
    clean = {k: "<redacted>" if k.lower() in SECRET_HEADERS else v for k, v in headers.items()}
    return {**template, "headers": clean}


def _version(distribution: str) -> str:
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:
        return ""
