"""A deadline on receiving a unary call's request message (``--receive-timeout-s``).

gRPC runs a unary method only once its whole message has arrived, and its C core keeps what a
stream has received until then: a sender that stops mid-message pins up to ``--max-message-mb``
per stream until its connection is closed (docs/reliability.md, "What one connection can pin").
This interceptor serves each unary-unary method as client-streaming (identical on the wire) and
reads the one message itself; a call still waiting for it after the timeout is answered
DEADLINE_EXCEEDED, which closes the stream and frees what it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

NO_MESSAGE = "the call ended without a request message"
MAX_SWEEP_S = 1.0  # the deadline is enforced to within this (a quarter of a shorter timeout)


def receive_timeout_details(timeout_s: float) -> str:
    """The status message of a call whose request did not arrive in time."""
    return f"the request message did not arrive within {timeout_s:g} s (--receive-timeout-s)"


class ReceiveDeadline(grpc.aio.ServerInterceptor):
    """Bounds the wait for every coroutine unary-unary method's request; other methods pass.

    One timer per server sweeps the calls still waiting (a per-call timer cost a third more of
    the interceptor's CPU per request: docs/benchmarks.md)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.details = receive_timeout_details(timeout_s)
        self.sweep_s = min(MAX_SWEEP_S, timeout_s / 4)
        # One wrapped handler per known method (a fixed set: unknown methods are not cached).
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._waiting: dict[Any, float] = {}  # servicer context -> deadline (loop time); inf: expiring
        self._timer: asyncio.TimerHandle | None = None
        self._expiring: set[asyncio.Task[None]] = set()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        cached = self._handlers.get(method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if (
            handler.request_streaming
            or handler.response_streaming
            or not inspect.iscoroutinefunction(handler.unary_unary)
        ):
            self._handlers[method] = handler
            return handler
        self._handlers[method] = bounded = self._bounded(handler)
        return bounded

    def _bounded(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        behaviour, waiting = handler.unary_unary, self._waiting

        async def one_message(_requests: Any, context: grpc.aio.ServicerContext) -> Any:
            loop = asyncio.get_running_loop()
            waiting[context] = loop.time() + self.timeout_s
            if self._timer is None:
                self._timer = loop.call_later(self.sweep_s, self._sweep, loop)
            try:
                request = await context.read()
            finally:
                waiting.pop(context, None)
            if request is grpc.aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NO_MESSAGE)
            return await behaviour(request, context)

        return grpc.stream_unary_rpc_method_handler(
            one_message,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        for context, deadline in self._waiting.items():
            if deadline <= now:
                self._waiting[context] = math.inf
                task = loop.create_task(self._expire(context))
                self._expiring.add(task)
                task.add_done_callback(self._expiring.discard)
        if self._waiting:
            self._timer = loop.call_later(self.sweep_s, self._sweep, loop)

    async def _expire(self, context: grpc.aio.ServicerContext) -> None:
        if self._waiting.pop(context, None) is None:
            return  # the message arrived meanwhile: the call goes on
        # abort raises once the status is sent; the call's own read then ends with that error.
        with contextlib.suppress(Exception):
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, self.details)
