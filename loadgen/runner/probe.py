"""Fail fast: check a target answers health and ServerInfo before any load is sent."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from netgain.errors import NetgainError
from netgain.protos import InferenceStub, pb

# What gRPC says when the port answers, but not in HTTP/2 (an HTTP/1 server such as /metrics).
_NOT_GRPC = ("failed parsing http/2", "http1.x server", "expected settings frame")


def not_grpc(target: str, exc: grpc.RpcError) -> NetgainError | None:
    """The error for a port that answered in another protocol than gRPC; waiting will not mend it."""
    if not any(s in str(exc.details()).lower() for s in _NOT_GRPC):
        return None
    return NetgainError(
        f"target {target} is not a gRPC server (it answers, but not in HTTP/2: the metrics port?); "
        "--target takes the gRPC port `netgain serve` printed (default 50051)"
    )


def channel_for(target: str, tls_ca: str | None = None) -> grpc.Channel:
    if tls_ca:
        with open(tls_ca, "rb") as fh:
            return grpc.secure_channel(target, grpc.ssl_channel_credentials(fh.read()))
    return grpc.insecure_channel(target)


class Refused(Exception):
    """A check found nothing listening (connection refused): ``wait_ready`` fails on it after the grace."""


def wait_ready(
    check: Callable[[], tuple[Any, str]],
    wait_ready_s: float,
    say: Callable[[str], None] | None,
    waiting: Callable[[str], str],
    not_ready: Callable[[str], str],
    refused: str = "",
    refused_grace_s: float | None = None,
) -> Any:
    """Call ``check`` (a result, or None and why not yet) every 0.2 s until it gives a result, for
    up to ``wait_ready_s``; then NetgainError(``not_ready(why)``). ``say`` is told once, as the wait
    begins, ``waiting(why)`` (a silent wait of up to --wait-ready-s looks like a hang). A check that
    raises ``Refused(why)`` still after ``refused_grace_s`` fails at once with ``refused``: nothing
    listens there, which waiting rarely mends."""
    start = time.monotonic()
    deadline = start + wait_ready_s
    said = False
    while True:
        try:
            result, last = check()
            if result is not None:
                return result
        except Refused as exc:
            last = str(exc)
            if refused_grace_s is not None and time.monotonic() - start >= refused_grace_s:
                raise NetgainError(refused) from None
        if time.monotonic() >= deadline:
            raise NetgainError(not_ready(last))
        if not said and say is not None:
            grace = (
                "" if refused_grace_s is None else f"; refused connections fail after {refused_grace_s:g} s"
            )
            say(waiting(last) + grace)
            said = True
        time.sleep(0.2)


def probe_target(
    target: str,
    wait_ready_s: float = 0.0,
    tls_ca: str | None = None,
    say: Callable[[str], None] | None = None,
    refused_grace_s: float | None = None,
) -> Any:
    """ServerInfo of ``target`` once its health is SERVING (waiting up to ``wait_ready_s``;
    ``say`` is told once when the wait begins). With ``refused_grace_s``, a connection still
    refused after that long fails at once: nothing listens there, which waiting rarely mends
    (``--wait-ready-s`` given explicitly waits for that too, as for a server that is starting)."""
    if ":" not in target:
        raise NetgainError(f"--target {target!r}: expected HOST:PORT")
    with channel_for(target, tls_ca) as ch:
        health = health_pb2_grpc.HealthStub(ch)

        def check() -> tuple[Any, str]:
            try:
                resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=3.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return InferenceStub(ch).ServerInfo(pb.ServerInfoRequest(), timeout=5.0), ""
                return None, f"health is {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}"
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
                wrong = not_grpc(target, exc)
                if wrong is not None:
                    raise wrong from None
                if "refused" in str(exc.details()).lower():
                    raise Refused(last) from None
                return None, last

        return wait_ready(
            check,
            wait_ready_s,
            say,
            waiting=lambda last: f"waiting up to {wait_ready_s:g} s for {target} to be SERVING ({last})",
            not_ready=lambda last: (
                f"target {target} is not ready ({last}); is `netgain serve` running there? "
                "(--wait-ready-s waits for it)"
            ),
            refused=(
                f"target {target} refused the connection: nothing listens there; is `netgain "
                "serve` running, on that port? (--wait-ready-s S waits S s for a starting server)"
            ),
            refused_grace_s=refused_grace_s,
        )


def _rpc_error(exc: grpc.RpcError) -> str:
    """``CODE: details`` on one line (a server's message may hold newlines)."""
    return f"{exc.code().name}: {' '.join(str(exc.details()).split())}"


def _oip_model_state(stub: Any, model_name: str) -> tuple[bool, str]:
    """For a model whose ModelReady is not true: (unknown, what the server says). Unknown when the
    server is ready and answers ModelMetadata for the model NOT_FOUND, or with a message saying
    "not found" (Triton: "Request for unknown model: 'x' is not found"); otherwise the server or
    the model is still loading, or the server cannot be asked ("" then: the caller's reason stands)."""
    from netgain.protos import oip_pb2 as oip

    try:
        if not stub.ServerReady(oip.ServerReadyRequest(), timeout=3.0).ready:
            return False, "the server is not ready"
    except grpc.RpcError:
        return False, ""
    try:
        stub.ModelMetadata(oip.ModelMetadataRequest(name=model_name), timeout=5.0)
    except grpc.RpcError as exc:
        # Triton says "Request for unknown model" also while a model loads ("... is not at ready
        # state", UNAVAILABLE): only NOT_FOUND, or "not found", means the server lacks it.
        if exc.code() == grpc.StatusCode.NOT_FOUND or "not found" in str(exc.details()).lower():
            return True, _rpc_error(exc)
        return False, f"the server is ready, the model is not: {_rpc_error(exc)}"
    return False, f"the server is ready, model {model_name!r} is loading"


def probe_oip_target(
    target: str,
    model_name: str,
    payload_model: str,
    wait_ready_s: float = 0.0,
    tls_ca: str | None = None,
    say: Callable[[str], None] | None = None,
) -> Any:
    """An Open Inference Protocol server (Triton, KServe, MLServer, `netgain serve`): waits for
    ``ModelReady(model_name)`` while the server or the model is loading, fails at once when the
    server is ready and does not know the model, and reads ``ModelMetadata``. Returns a ServerInfoResponse as
    ``probe_target`` does, for the rest of the run: ``handler`` is ``payload_model`` (the payloads
    to make), ``handler_options`` carry the model's input tensor (``oip.*`` keys, read by
    ``PayloadFactory``), and no metrics port (such a server's metrics are not netgain's)."""
    from netgain.protos import oip_pb2 as oip
    from netgain.protos.service import OipStub

    if ":" not in target:
        raise NetgainError(f"--target {target!r}: expected HOST:PORT")
    with channel_for(target, tls_ca) as ch:
        stub = OipStub(ch)

        def check() -> tuple[Any, str]:
            try:
                if stub.ModelReady(oip.ModelReadyRequest(name=model_name), timeout=3.0).ready:
                    return stub.ModelMetadata(oip.ModelMetadataRequest(name=model_name), timeout=5.0), ""
                last = f"model {model_name!r} is not ready"
            except grpc.RpcError as exc:
                wrong = not_grpc(target, exc)
                if wrong is not None:
                    raise wrong from None
                last = _rpc_error(exc)
            unknown, state = _oip_model_state(stub, model_name)
            if unknown:  # a ready server that does not know the model: waiting will not mend it
                raise NetgainError(
                    f"target {target} has no ready Open Inference Protocol model {model_name!r}: the "
                    f"server is ready and does not know it ({state}); --oip-model names it"
                )
            return None, state or last

        meta = wait_ready(
            check,
            wait_ready_s,
            say,
            waiting=lambda last: (
                f"waiting up to {wait_ready_s:g} s for {target} model {model_name!r} ({last})"
            ),
            not_ready=lambda last: (
                f"target {target} has no ready Open Inference Protocol model {model_name!r} ({last}); "
                "--oip-model names it, --wait-ready-s waits for it"
            ),
        )
    inputs = [(t.name, t.datatype, [int(d) for d in t.shape]) for t in meta.inputs]
    return oip_server_info(model_name, payload_model, meta.name, meta.platform, inputs, "oip")


def oip_server_info(
    model_name: str,
    payload_model: str,
    name: str,
    platform: str,
    inputs: list[tuple[str, str, list[int]]],
    protocol: str,
) -> Any:
    """What a probe of an Open Inference Protocol model (gRPC or REST) returns, from its metadata:
    a ServerInfoResponse whose ``handler_options`` carry its one input tensor (``oip.*`` keys, read
    by the senders). NetgainError when netgain cannot feed the model (not one BYTES or FP32 input)."""
    if len(inputs) != 1:
        names = ", ".join(t[0] for t in inputs)
        raise NetgainError(f"model {model_name!r} takes {len(inputs)} inputs ({names}); netgain sends one")
    tensor, datatype, shape = inputs[0]
    if datatype not in ("BYTES", "FP32"):
        raise NetgainError(
            f"model {model_name!r} input {tensor!r} is {datatype}; netgain sends BYTES "
            "(image, text, null payloads) or FP32 rows (tabular)"
        )
    options = {
        "oip.model": model_name,
        "oip.input": tensor,
        "oip.datatype": datatype,
        "oip.shape": ",".join(str(d) for d in shape),
    }
    if datatype == "FP32" and len(shape) >= 2 and shape[-1] > 0:
        options["features"] = str(shape[-1])
    return pb.ServerInfoResponse(
        model=name,
        handler=payload_model,
        handler_options=options,
        metrics_port=-1,
        ready=True,
        versions={"protocol": protocol, "platform": platform},
    )
