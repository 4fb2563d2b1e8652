"""KServe v2 REST (the Open Inference Protocol over HTTP/1.1) on aiohttp, in the event loop that
serves gRPC, through the same request path (``InferenceServicer.infer_items``): request id,
admission, queue, batching, span log, metrics. The phases come back in a ``server-timing`` response
header (exactly the gRPC trailer's value, netgain/contract/phases.py) beside ``x-request-id``, on
errors too. Errors are ``{"error": message, "code": gRPC status name}`` with the HTTP status of
``STATUS``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
from aiohttp import web

import netgain
from netgain.server.config import ServeConfig
from netgain.server.oip import INPUT_NAME, METADATA_OUTPUTS, VERSION, BadTensor, ModelIO, OipServicer
from netgain.server.rest.codec import (
    BINARY_TYPE,
    HEADER_LENGTH,
    JSON_TYPE,
    InferBody,
    body_id,
    encode_response,
    error_body,
    max_json_values,
    read_infer,
    split_body,
)
from netgain.server.service import METADATA_TOO_LARGE, InferenceServicer

# gRPC status → HTTP status. RESOURCE_EXHAUSTED is a full queue (503, like a server not ready:
# retry elsewhere or later), except the two size limits below, which retrying cannot cure.
STATUS = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 503,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
BODY_TOO_LARGE = 413
HEADERS_TOO_LARGE = 431
BACKLOG = 1024  # connections the kernel queues before accept: a burst of new clients, not 128


def as_headers(trailers: Iterable[tuple[str, str | bytes]]) -> tuple[tuple[str, str], ...]:
    """The servicer's trailers as HTTP headers: a value it gives as bytes (gRPC's own form) is ASCII."""
    return tuple((k, v.decode("ascii") if isinstance(v, bytes) else v) for k, v in trailers)


class Aborted(Exception):
    """``context.abort`` of an HTTP call: the request failed with this code, message and trailers."""

    def __init__(self, code: str, message: str, trailers: Iterable[tuple[str, str | bytes]]) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = as_headers(trailers)


class HttpCall:
    """What ``infer_items`` reads of a gRPC call, from an HTTP request: the headers as metadata
    (names lower-case, as gRPC gives them), no deadline, and the trailers as response headers."""

    __slots__ = ("metadata", "trailers")

    def __init__(self, headers: Any) -> None:
        self.metadata = [(k.lower(), v) for k, v in headers.items()]
        self.trailers: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def time_remaining(self) -> float | None:
        return None

    def set_trailing_metadata(self, trailers: Iterable[tuple[str, str | bytes]]) -> None:
        self.trailers = as_headers(trailers)

    async def abort(self, code: grpc.StatusCode, message: str, trailing_metadata: Any = ()) -> None:
        raise Aborted(code.name, message, trailing_metadata)


def http_status(code: str, message: str) -> int:
    if message == METADATA_TOO_LARGE:
        return HEADERS_TOO_LARGE
    return STATUS.get(code, 500)


def _json(payload: Any, status: int = 200, headers: Any = None) -> web.Response:
    body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return web.Response(body=body, status=status, content_type=JSON_TYPE, headers=headers)


def _error(status: int, message: str, code: str, headers: Any = None) -> web.Response:
    return web.Response(
        body=error_body(message, code), status=status, content_type=JSON_TYPE, headers=headers
    )


class BodyTooLarge(Exception):
    pass


class RestEndpoint:
    """The routes, over the gRPC OIP servicer's view of the model (names, versions, readiness)."""

    def __init__(self, inner: InferenceServicer, io: ModelIO, max_body: int) -> None:
        self.inner = inner
        self.oip = OipServicer(inner, io)
        self.io = io
        self.max_body = max_body
        self.max_values = max_json_values(io, inner.limits.max_items)

    def app(self) -> web.Application:
        # client_max_size one past the limit: aiohttp refuses a body of exactly its size.
        app = web.Application(client_max_size=self.max_body + 1, middlewares=[_json_errors])
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version}"
        app.router.add_get("/v2/health/live", self.live)
        app.router.add_get("/v2/health/ready", self.server_ready)
        app.router.add_get("/v2", self.server_metadata)
        for base in (model, versioned):
            app.router.add_get(base, self.model_metadata)
            app.router.add_get(base + "/ready", self.model_ready)
            app.router.add_post(base + "/infer", self.infer)
        return app

    @staticmethod
    def _asked(request: web.Request) -> tuple[str, str]:
        return request.match_info["model"], request.match_info.get("version", "")

    async def live(self, request: web.Request) -> web.Response:
        return _json({"live": True})

    async def server_ready(self, request: web.Request) -> web.Response:
        ready = self.oip.ready()
        return _json({"ready": ready}, 200 if ready else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json(
            {"name": "netgain", "version": netgain.__version__, "extensions": ["binary_tensor_data"]}
        )

    async def model_metadata(self, request: web.Request) -> web.Response:
        name, version = self._asked(request)
        if not self.oip.known(name, version):
            return _error(404, self.oip.missing(name, version), "NOT_FOUND")
        return _json(
            {
                "name": self.inner.model,
                "versions": [VERSION],
                "platform": self.oip.platform,
                "inputs": [{"name": INPUT_NAME, "datatype": self.io.datatype, "shape": self.io.input_shape}],
                "outputs": [{"name": n, "datatype": d, "shape": [-1]} for n, d in METADATA_OUTPUTS],
            }
        )

    async def model_ready(self, request: web.Request) -> web.Response:
        name, version = self._asked(request)
        if not self.oip.known(name, version):
            return _error(404, self.oip.missing(name, version), "NOT_FOUND")
        ready = self.oip.ready()
        return _json({"name": name, "ready": ready}, 200 if ready else 503)

    async def _read(self, request: web.Request) -> bytes:
        """The body, refused before it is read when its declared length is over the limit."""
        limit = self.max_body
        declared = request.content_length
        if declared is not None and declared > limit:
            raise BodyTooLarge(
                f"request body is {declared} bytes, over the limit of {limit} (--max-message-mb)"
            )
        over = f"request body is over the limit of {limit} bytes (--max-message-mb)"
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:  # a chunked body, counted as it came
            raise BodyTooLarge(over) from None
        if len(body) > limit:
            raise BodyTooLarge(over)
        return body

    async def infer(self, request: web.Request) -> web.Response:
        inner = self.inner
        arrival = inner.clock()
        name, version = self._asked(request)
        call = HttpCall(request.headers)
        refused: tuple[Any, str] | None = None
        status = 0
        asked: InferBody | None = None
        rid = ""
        if not self.oip.known(name, version):
            refused = (grpc.StatusCode.NOT_FOUND, self.oip.missing(name, version))
        else:
            try:
                body = await self._read(request)
                header, binary = split_body(body, request.headers.get(HEADER_LENGTH), self.max_values)
                rid = body_id(header)
                asked = read_infer(header, binary, self.io, inner.limits.max_items)
            except BodyTooLarge as exc:
                refused, status = (grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)), BODY_TOO_LARGE
            except BadTensor as exc:
                refused = (grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            inputs = asked.inputs if asked is not None else []
            p = await inner.infer_items(arrival, "", inputs, call, refused, fallback_id=rid)
        except Aborted as exc:
            return _error(status or http_status(exc.code, exc.message), exc.message, exc.code, exc.trailers)
        body, json_length = encode_response(inner.model, rid, p.outputs, asked)
        headers = dict(call.trailers)
        if json_length is not None:
            headers[HEADER_LENGTH] = str(json_length)
        return web.Response(
            body=body, content_type=JSON_TYPE if json_length is None else BINARY_TYPE, headers=headers
        )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such route, wrong method) as the protocol's JSON errors."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            message = f"no such endpoint: {request.method} {request.path} (this server answers /v2/...)"
        elif exc.status == 405:
            message = f"{request.method} is not allowed on {request.path}"
        else:
            message = exc.reason
        code = {404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED"}.get(exc.status, "INVALID_ARGUMENT")
        return _error(exc.status, message, code)


def ssl_context(cfg: ServeConfig) -> ssl.SSLContext | None:
    """--tls-cert/--tls-key (and --tls-client-ca: client certificates required), as gRPC serves."""
    if not cfg.tls_cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    if cfg.tls_client_ca:
        ctx.load_verify_locations(cfg.tls_client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class HttpServer:
    """A listening REST endpoint; ``close`` stops accepting and ends its connections."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner = runner
        self.port = port

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_http(
    cfg: ServeConfig, servicer: InferenceServicer, io: ModelIO, *, reuse_port: bool
) -> HttpServer:
    """The REST endpoint on ``cfg.host:cfg.http_port`` (0: a free port). ``reuse_port``: the
    --workers frontends share the port (SO_REUSEPORT), as they share gRPC's."""
    endpoint = RestEndpoint(servicer, io, cfg.max_message_bytes)
    runner = web.AppRunner(
        endpoint.app(), access_log=None, handle_signals=False, shutdown_timeout=cfg.grace_s
    )
    await runner.setup()
    site = web.TCPSite(
        runner, cfg.host, cfg.http_port, ssl_context=ssl_context(cfg), backlog=BACKLOG, reuse_port=reuse_port
    )
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ValueError(
            f"--http-port {cfg.http_port}: cannot serve on {cfg.host}:{cfg.http_port} ({exc.strerror}); "
            "choose another --http-port (0: any free port)"
        ) from None
    return HttpServer(runner, int(runner.addresses[0][1]))
