"""A deadline on receiving a unary call's request message (``--receive-timeout-s``).

gRPC runs a unary method only once its whole message has arrived, and its C core keeps what a
stream has received until then: a sender that stops mid-message pins up to ``--max-message-mb``
per stream until its connection is closed (docs/reliability.md, "What one connection can pin").
This interceptor serves each unary-unary method as client-streaming (identical on the wire),
awaits the one message for at most the timeout and otherwise answers DEADLINE_EXCEEDED, which
closes the stream and frees what it held.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc


def receive_timeout_details(timeout_s: float) -> str:
    """The status message of a call whose request did not arrive in time."""
    return f"the request message did not arrive within {timeout_s:g} s (--receive-timeout-s)"


def _bounded(handler: grpc.RpcMethodHandler, timeout_s: float) -> grpc.RpcMethodHandler:
    behaviour = handler.unary_unary
    details = receive_timeout_details(timeout_s)

    async def one_message(_requests: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                request = await context.read()
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, details)
        if request is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without a request message")
        return await behaviour(request, context)

    return grpc.stream_unary_rpc_method_handler(
        one_message,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class ReceiveDeadline(grpc.aio.ServerInterceptor):
    """Bounds the wait for every coroutine unary-unary method's request; other methods pass."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # One wrapped handler per known method (a fixed set: unknown methods are not cached).
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

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
        if handler.request_streaming or handler.response_streaming or not inspect.iscoroutinefunction(
            handler.unary_unary
        ):
            self._handlers[method] = handler
            return handler
        self._handlers[method] = bounded = _bounded(handler, self.timeout_s)
        return bounded
