"""The gRPC servicer (grpc.aio): validation, enqueue, trailers, results."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from netgain.contract.phases import REQUEST_ID_KEY, TIMING_KEY, TrailerEncoder, trailer_value
from netgain.protos import inference_pb2 as pb
from netgain.server.batching.queue import Pending, QueueClosed, QueueFull, RequestQueue
from netgain.server.telemetry.recorder import Recorder

TRACEPARENT_KEY = "traceparent"  # W3C Trace Context, as gRPC metadata (lower-case, as all keys)

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}\Z")  # \Z: "$" would accept a trailing newline

# The header-list size the server advertises (SETTINGS_MAX_HEADER_LIST_SIZE, as grpc.max_metadata_size).
# gRPC enforces it only once the client has acknowledged the setting; the servicer checks the rest.
MAX_METADATA_BYTES = 16 * 1024
METADATA_TOO_LARGE = (
    f"request metadata is over the {MAX_METADATA_BYTES}-byte header-list size this server advertises"
)


class _DropInvalidEncoding(logging.Filter):
    """gRPC's Cython layer logs an ERROR with a traceback each time it decodes a metadata value
    that is not UTF-8 (twice per call: once to route it, once for invocation_metadata), then
    decodes it as Latin-1. A client could flood the log with one bad header per request; the
    servicer refuses such a request id itself (INVALID_ARGUMENT, counted in the metrics), so
    these records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Invalid encoding on")


_INVALID_ENCODING_FILTER = _DropInvalidEncoding()


def quiet_grpc_decode_errors() -> None:
    """Idempotent: installs the filter on gRPC's Cython logger."""
    logger = logging.getLogger("grpc._cython.cygrpc")
    if _INVALID_ENCODING_FILTER not in logger.filters:
        logger.addFilter(_INVALID_ENCODING_FILTER)


class Limits:
    def __init__(self, max_items: int, max_message_bytes: int) -> None:
        self.max_items = max_items
        self.max_message_bytes = max_message_bytes


def validate_request(request: pb.InferRequest, model: str, limits: Limits) -> tuple[Any, str] | None:
    """Checks that need no handler. Returns (status code, message) or None when acceptable."""
    return validate_items(request.model, request.inputs, model, limits)


def validate_items(
    asked: str, inputs: Sequence[pb.Input], model: str, limits: Limits
) -> tuple[Any, str] | None:
    """validate_request for any protocol: ``asked`` is the model the request named ("" for any)."""
    if asked and asked != model:
        return (
            grpc.StatusCode.NOT_FOUND,
            f"model {asked!r} is not served here (this server runs {model!r})",
        )
    n = len(inputs)
    if n == 0:
        return grpc.StatusCode.INVALID_ARGUMENT, "request has no inputs: add at least one Input"
    if n > limits.max_items:
        return (
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request has {n} inputs, over the limit of {limits.max_items} (--max-items-per-request)",
        )
    for i, item in enumerate(inputs):
        if not item.data and not item.features:
            return grpc.StatusCode.INVALID_ARGUMENT, f"input {i} is empty: set data or features"
    return None


class InferenceServicer:
    def __init__(
        self,
        model: str,
        requests: RequestQueue,
        recorder: Recorder | None,
        limits: Limits,
        info: Callable[[], pb.ServerInfoResponse],
        profile: Callable[[int, bool], Any],
        instrumented: bool = True,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.model = model
        self.requests = requests
        self.recorder = recorder
        self.limits = limits
        self._info = info
        self._profile = profile
        self.instrumented = instrumented
        self.clock = clock
        self.ready = False
        self.stopping = False  # set on SIGTERM, before the gRPC server stops accepting
        self.refused_ns = 0  # arrival of the last request refused while stopping: a drain waits for quiet
        self.in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._anon = 0
        self._prefix = f"srv{os.getpid()}-"
        self._encoder = TrailerEncoder()  # the event loop's alone, as every caller of _trailers
        quiet_grpc_decode_errors()

    def deliver(self, reqs: list[Pending]) -> None:
        """Called from pipeline threads: one loop wake-up per group of finished requests."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(_resolve_all, reqs)

    def _request_id(self, context: Any, fallback: str = "") -> tuple[str, str | None, str]:
        """(request id, why it is refused or None, the raw W3C traceparent or ""): one pass over
        the metadata; the traceparent is validated off the event loop, by the recorder thread."""
        rid: str | None = None
        traceparent = ""
        size = 0
        for key, value in context.invocation_metadata() or ():
            size += len(key) + len(value) + 32  # HTTP/2 counts 32 bytes per header beside name and value
            if key == REQUEST_ID_KEY and rid is None:
                rid = value
            elif key == TRACEPARENT_KEY:
                traceparent = value
        if size > MAX_METADATA_BYTES:
            return "invalid", METADATA_TOO_LARGE, ""
        if rid is not None:
            if not rid.isascii():  # gRPC decoded non-UTF-8 bytes as Latin-1
                return "invalid", "x-request-id must be ASCII: 1-128 characters of A-Z a-z 0-9 . _ : -", ""
            if not REQUEST_ID_RE.match(rid):
                return "invalid", "x-request-id must be 1-128 characters of A-Z a-z 0-9 . _ : -", ""
            return rid, None, traceparent
        rid, bad = self._fallback_id(fallback)
        return rid, bad, traceparent

    def _fallback_id(self, fallback: str) -> tuple[str, str | None]:
        if fallback:
            if not REQUEST_ID_RE.match(fallback):
                return "invalid", "the request id must be 1-128 characters of A-Z a-z 0-9 . _ : -"
            return fallback, None
        self._anon += 1
        return f"{self._prefix}{self._anon}", None

    def _trailers(self, p: Pending, total_ns: int) -> tuple[tuple[str, str | bytes], ...]:
        if not self.instrumented:
            return ((REQUEST_ID_KEY, p.request_id),)
        timing: str | bytes
        if p.timing_head:  # the pipeline formatted all but post and total
            timing = trailer_value(p.timing_head, p.spans["post"], total_ns, p.batch_id, p.batch_size)
        else:
            timing = self._encoder.encode(p.spans, total_ns, p.batch_id, p.batch_size)
        return (
            (TIMING_KEY, timing),
            (REQUEST_ID_KEY, p.request_id),
        )

    async def Infer(self, request: pb.InferRequest, context: Any) -> pb.InferResponse:
        arrival = self.clock()
        p = await self.infer_items(arrival, request.model, request.inputs, context)
        return pb.InferResponse(
            model=self.model, outputs=p.outputs, batch_id=max(0, p.batch_id), batch_size=p.batch_size
        )

    async def infer_items(
        self,
        arrival: int,
        asked_model: str,
        inputs: Sequence[pb.Input],
        context: Any,
        refused: tuple[Any, str] | None = None,
        fallback_id: str = "",
    ) -> Pending:
        """The request path every protocol shares (netgain.v1 here, the Open Inference Protocol in
        oip.py): request id, admission, the queue and its batching, accounting, trailers. Returns the
        answered request; a failure aborts the call (with the trailers) instead. ``refused`` is the
        protocol's own verdict on the request (code, message), failed and counted like the others;
        ``fallback_id`` is a request id the protocol carries when the metadata has none."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        rid, bad_id, traceparent = self._request_id(context, fallback_id)
        p = Pending(rid, inputs, arrival)
        if traceparent:
            p.traceparent = traceparent
        error: tuple[Any, str] | None = None
        if bad_id:
            code = (
                grpc.StatusCode.RESOURCE_EXHAUSTED
                if bad_id == METADATA_TOO_LARGE
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            error = (code, bad_id)
        elif self.stopping:
            self.refused_ns = arrival
            error = (grpc.StatusCode.UNAVAILABLE, "server is shutting down; send to another replica")
        elif not self.ready:
            error = (grpc.StatusCode.UNAVAILABLE, "model is loading or warming up; wait for health SERVING")
        elif refused is not None:
            error = refused
        else:
            error = validate_items(asked_model, inputs, self.model, self.limits)
        if error is None:
            remaining = context.time_remaining()
            if remaining is not None:
                p.deadline_ns = arrival + int(remaining * 1e9)
            p.future = self._loop.create_future()
            try:
                self.requests.put(p)
            except QueueFull as exc:
                error = (grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc}; request shed, retry later")
            except QueueClosed as exc:
                error = (grpc.StatusCode.UNAVAILABLE, str(exc))
        if error is None:
            self.in_flight += 1
            try:
                await p.future
            finally:
                self.in_flight -= 1
            resumed = self.clock()
            p.spans["post"] = resumed - p.post_start_ns
        else:
            resumed = self.clock()
            p.fail(error[0].name, error[1])
        total = resumed - arrival
        if self.recorder is not None:
            self.recorder.request_done(p, total)
        trailers = self._trailers(p, total)
        if p.code != "OK":
            await context.abort(grpc.StatusCode[p.code], p.message, trailing_metadata=trailers)
        context.set_trailing_metadata(trailers)
        return p

    async def ServerInfo(self, request: pb.ServerInfoRequest, context: Any) -> pb.ServerInfoResponse:
        return self._info()

    async def Profile(self, request: pb.ProfileRequest, context: Any) -> pb.ProfileResponse:
        batches = request.batches or 10
        try:
            capture = self._profile(batches, request.ranges_only)
        except (RuntimeError, ValueError) as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        try:
            capture.start()  # on the main thread: Kineto requires it (see ProfileCapture)
        except RuntimeError as exc:  # the profiler itself would not start: not the caller's fault
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        try:
            done = await asyncio.to_thread(capture.done.wait, 600.0)
        finally:  # also when the caller goes away: a capture left running would refuse all others
            capture.stop()
        if not done or capture.error:
            await context.abort(
                grpc.StatusCode.INTERNAL, capture.error or "profile capture timed out (600 s)"
            )
        return pb.ProfileResponse(trace_path=capture.path, batches=capture.seen, batch_ids=capture.batch_ids)


def _resolve_all(reqs: list[Pending]) -> None:
    for p in reqs:
        fut = p.future
        if fut is not None and not fut.done():
            fut.set_result(None)
