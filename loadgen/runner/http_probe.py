"""Fail fast for HTTP targets: check a target answers HTTP, and is ready, before any load is sent.

``--protocol oip-http``: KServe v2 REST readiness (``/v2/models/{m}/ready``, ``/v2/health/ready``)
and the model's metadata (``/v2/models/{m}``: its input tensor), as ``probe_oip_target`` does over
gRPC. ``--protocol http-json``: the template's ``ready_path`` until it answers 2xx, or, without
one, any HTTP answer to ``GET /``. Waiting, refused connections and their messages follow
``probe_target``.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Callable
from typing import Any

from netgain.errors import NetgainError
from netgain.loadgen.http_requests import oip_path
from netgain.loadgen.runner.probe import Refused, oip_server_info, wait_ready
from netgain.protos import pb

TIMEOUT_S = 3.0
MAX_BODY = 1 << 20  # a metadata document is a few kB


class _NotYet(Exception):
    """No answer yet (a timeout, a reset): waited for, like a server that is starting."""


def not_http(target: str) -> NetgainError:
    return NetgainError(
        f"target {target} is not an HTTP/1.1 server (it answers, but not in HTTP: the gRPC port?); "
        "--target takes the server's HTTP port"
    )


def http_get(target: str, path: str, tls_ca: str | None = None) -> tuple[int, bytes, Any]:
    """``GET path`` on a fresh connection: (status, body, headers). Refused when nothing listens,
    _NotYet when nothing answers in time, NetgainError when the answer is not HTTP."""
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    conn: http.client.HTTPConnection
    if tls_ca:
        ctx = ssl.create_default_context(cafile=tls_ca)
        conn = http.client.HTTPSConnection(host, int(port), timeout=TIMEOUT_S, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request("GET", path, headers={"User-Agent": "netgain-load"})
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_BODY), resp.headers
    except ConnectionRefusedError:
        raise Refused("connection refused") from None
    except (http.client.BadStatusLine, http.client.LineTooLong):
        raise not_http(target) from None
    except ssl.SSLError as exc:
        raise NetgainError(f"target {target}: TLS failed ({exc.reason or exc}); is --tls-ca right?") from None
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        raise _NotYet(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
    finally:
        conn.close()


def _reason(status: int, body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            text = doc["error"]
    except ValueError:
        pass
    text = " ".join(text.split())[:160]
    return f"HTTP {status}" + (f": {text}" if text else "")


def wait_http(
    target: str,
    check: Callable[[], tuple[Any, str]],
    what: str,
    wait_ready_s: float,
    say: Callable[[str], None] | None,
    refused_grace_s: float | None,
) -> Any:
    """``wait_ready`` for an HTTP target: ``check`` (a result, or None and why not yet) until it
    gives a result; no answer in time is waited for like a server that is starting."""

    def attempt() -> tuple[Any, str]:
        try:
            return check()
        except _NotYet as exc:
            return None, f"no answer: {exc}"

    return wait_ready(
        attempt,
        wait_ready_s,
        say,
        waiting=lambda last: f"waiting up to {wait_ready_s:g} s for {target}: {what} ({last})",
        not_ready=lambda last: f"target {target} is not ready: {what} ({last}); --wait-ready-s waits for it",
        refused=(
            f"target {target} refused the connection: nothing listens there; is the server "
            "running, on that port? (--wait-ready-s S waits S s for a starting server)"
        ),
        refused_grace_s=refused_grace_s,
    )


def _unknown_model(status: int, body: bytes) -> bool:
    """A metadata answer that says the server lacks the model: 404, or "not found"/"unknown model"
    (Triton answers 400 "Request for unknown model: 'x' is not found")."""
    text = body.decode("utf-8", "replace").lower()
    return status == 404 or (400 <= status < 500 and ("not found" in text or "unknown model" in text))


def probe_oip_http_target(
    target: str,
    model_name: str,
    payload_model: str,
    wait_ready_s: float = 0.0,
    tls_ca: str | None = None,
    say: Callable[[str], None] | None = None,
    refused_grace_s: float | None = None,
) -> Any:
    """A KServe v2 REST server: waits for ``/v2/models/{m}/ready`` while the server or the model is
    loading, fails at once when the server is ready and does not know the model, and reads the
    model's metadata into a ServerInfoResponse (as ``probe_oip_target``)."""
    base = oip_path(model_name)

    def check() -> tuple[Any, str]:
        status, body, _ = http_get(target, f"{base}/ready", tls_ca)
        if status == 200:
            status, body, _ = http_get(target, base, tls_ca)
            if status == 200:
                return _metadata(target, model_name, payload_model, body), ""
        server, sbody, _ = http_get(target, "/v2/health/ready", tls_ca)
        if server != 200:
            return None, f"the server is not ready: GET /v2/health/ready {_reason(server, sbody)}"
        status, body, _ = http_get(target, base, tls_ca)
        if _unknown_model(status, body):
            raise NetgainError(
                f"target {target} has no ready Open Inference Protocol model {model_name!r}: the server is "
                f"ready and does not know it ({_reason(status, body)}); --oip-model names it"
            )
        return None, f"the server is ready, model {model_name!r} is not ({_reason(status, body)})"

    return wait_http(
        target, check, f"model {model_name!r} (KServe v2 REST)", wait_ready_s, say, refused_grace_s
    )


def _metadata(target: str, model_name: str, payload_model: str, body: bytes) -> Any:
    try:
        meta = json.loads(body)
        inputs = [(str(t["name"]), str(t["datatype"]), [int(d) for d in t["shape"]]) for t in meta["inputs"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise NetgainError(
            f"target {target}: GET {oip_path(model_name)} is not KServe v2 model metadata ({exc!r})"
        ) from None
    name, platform = str(meta.get("name", model_name)), str(meta.get("platform", ""))
    return oip_server_info(model_name, payload_model, name, platform, inputs, "oip-http")


def probe_json_target(
    target: str,
    template: dict[str, Any],
    payload_model: str,
    wait_ready_s: float = 0.0,
    tls_ca: str | None = None,
    say: Callable[[str], None] | None = None,
    refused_grace_s: float | None = None,
) -> Any:
    """Any HTTP server: the template's ``ready_path`` must answer 2xx (waited for), or, without one,
    ``GET /`` must get an HTTP answer of any status. Returns a ServerInfoResponse for the run."""
    ready = template.get("ready_path")

    def check() -> tuple[Any, str]:
        status, body, headers = http_get(target, ready or "/", tls_ca)
        if ready and not 200 <= status < 300:
            return None, f"GET {ready} {_reason(status, body)}"
        return pb.ServerInfoResponse(
            model=payload_model,
            handler=payload_model,
            metrics_port=-1,
            ready=True,
            versions={"protocol": "http-json", "server": headers.get("Server", "")},
        ), ""

    what = f"GET {ready} answering 2xx" if ready else "an HTTP answer to GET /"
    return wait_http(target, check, what, wait_ready_s, say, refused_grace_s)
