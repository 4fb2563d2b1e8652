"""An HTTP/1.1 client for the sender engine: keep-alive connections on the engine's asyncio loop,
responses parsed by llhttp through geventhttpclient's parser (the one Locust's FastHttpUser uses).

Not geventhttpclient's own client: that one runs on gevent, and the engine sends from asyncio
(its precise timers and send-lag accounting are the gRPC path's, see ``engine``). One request per
connection at a time (no pipelining: a slow answer must not hold back the next request), so a
target gets as many connections as it has requests in flight; an idle one is reused, the most
recently used first. Deadlines are swept, not timed one by one: every request has the same
timeout, so the oldest pending request is always the first to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from typing import Any

from geventhttpclient._parser import HTTPParseError, HTTPResponseParser

KEEP_BODY = 4096  # bytes of a body kept for an error's reason (a traceback's end included)
SERVER_TIMING = "server-timing"


class HttpFailure(Exception):
    """A request that got no HTTP answer: ``code`` names it as the records do (``UNAVAILABLE``,
    ``DEADLINE_EXCEEDED``, ``INTERNAL``, ``CANCELLED``), ``reason`` says why in one line."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class Answer(HTTPResponseParser):
    """One response, parsed as it arrives: its status, reason phrase, ``Server-Timing`` value (several
    headers joined), body size and the body's first ``KEEP_BODY`` bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.status = 0
        self.phrase = ""
        self.timing: str | None = None
        self.size = 0
        self.body = b""
        self.done = False
        self._field = ""
        self._value: str | None = None

    # llhttp's callbacks (all of them must exist)
    def _on_message_begin(self) -> None:
        self.timing, self.size, self.body = None, 0, b""  # a final answer after an interim 1xx

    def _on_status(self, phrase: str) -> None:
        self.phrase = phrase

    def _on_header_field(self, piece: str) -> None:
        if self._value is not None:
            self._flush()
        self._field += piece

    def _on_header_value(self, piece: str) -> None:
        self._value = piece if self._value is None else self._value + piece

    def _flush(self) -> None:
        if self._field.lower() == SERVER_TIMING and self._value is not None:
            self.timing = self._value if self.timing is None else f"{self.timing}, {self._value}"
        self._field, self._value = "", None

    def _on_headers_complete(self) -> bool:
        self._flush()
        self.status = self.get_code()
        return False  # a body follows (no HEAD requests are sent)

    def _on_body(self, buf: bytearray) -> None:
        self.size += len(buf)
        if len(self.body) < KEEP_BODY:
            self.body += bytes(buf[: KEEP_BODY - len(self.body)])

    def _on_message_complete(self) -> None:
        self.done = self.status >= 200  # 1xx: interim, the final answer follows


class _Conn(asyncio.Protocol):
    """One keep-alive connection: at most one request on it at a time."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.answer: Answer | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.closed = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, data: bytes, waiter: asyncio.Future[Answer]) -> None:
        self.answer = Answer()
        self.waiter = waiter
        self.pool.pending[waiter][1] = self
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # bytes nobody asked for: what follows on this connection is not to be trusted
            self.close()
            return
        try:
            answer.feed(data)
        except HTTPParseError as exc:
            self.fail("INTERNAL", f"not an HTTP/1.1 response ({exc.args[0] if exc.args else exc})")
            return
        if answer.done:
            self._complete(answer)

    def eof_received(self) -> bool:
        answer = self.answer
        if answer is not None:
            with contextlib.suppress(HTTPParseError):
                answer.feed(b"")  # a body delimited by the connection's end ends here
            if answer.done:
                self._complete(answer)
        return False  # the transport closes; connection_lost fails a request still waiting

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None:
            why = f": {exc}" if exc else ""
            self.fail("UNAVAILABLE", f"connection closed before the response{why}")

    def _complete(self, answer: Answer) -> None:
        waiter = self.waiter
        self.answer = self.waiter = None
        assert waiter is not None
        self.pool.pending.pop(waiter, None)
        if answer.should_keep_alive() and not self.closed:
            self.pool.idle.append(self)
        else:
            self.close()
        if not waiter.done():
            waiter.set_result(answer)

    def fail(self, code: str, reason: str) -> None:
        """End the request on this connection with ``code``; the connection is closed."""
        waiter = self.waiter
        self.answer = self.waiter = None
        self.close()
        if waiter is not None:
            self.pool.pending.pop(waiter, None)
            if not waiter.done():
                waiter.set_exception(HttpFailure(code, reason))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()  # nothing of ours is left to flush; a reset frees the port at once


def connect_reason(exc: BaseException) -> str:
    """A failed connection in a few words."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror or exc})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect: {exc.strerror}"
    return f"cannot connect: {exc or type(exc).__name__}"


class HttpPool:
    """The connections of one target (``host:port``): ``request`` sends bytes on an idle one, or on
    one opened for it, and returns a future of its ``Answer`` (or of an ``HttpFailure``)."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout_s: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.timeout_s = timeout_s
        self.tls = tls
        self.idle: list[_Conn] = []
        # waiter -> [deadline (monotonic s), its connection once it has one], oldest first
        self.pending: dict[asyncio.Future[Answer], list[Any]] = {}
        self._connecting: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self.opened = 0  # connections opened, for the record

    def request(self, data: bytes) -> asyncio.Future[Answer]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Answer] = loop.create_future()
        self.pending[waiter] = [time.monotonic() + self.timeout_s, None]
        if self._sweeper is None:
            self._sweep()
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.send(data, waiter)
                return waiter
        task = loop.create_task(self._connect_send(data, waiter))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)
        return waiter

    async def _open(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: _Conn(self),
            self.host,
            self.port,
            ssl=self.tls,
            server_hostname=self.host if self.tls else None,
        )
        self.opened += 1
        return conn

    async def _connect_send(self, data: bytes, waiter: asyncio.Future[Answer]) -> None:
        try:
            conn = await self._open()
        except (OSError, ssl.SSLError) as exc:
            self.pending.pop(waiter, None)
            if not waiter.done():
                waiter.set_exception(HttpFailure("UNAVAILABLE", connect_reason(exc)))
            return
        if waiter.done():  # expired or cancelled while connecting: the connection serves the next one
            self.idle.append(conn)
            return
        conn.send(data, waiter)

    async def warm(self, n: int, timeout_s: float) -> None:
        """Open up to ``n`` connections before the run, so its first requests find them open; a
        target that refuses is left to the requests to report."""
        tasks = [asyncio.ensure_future(self._open()) for _ in range(n)]
        done, late = await asyncio.wait(tasks, timeout=timeout_s)
        for t in late:
            t.cancel()
        for t in done:
            if t.exception() is None:
                self.idle.append(t.result())

    def _sweep(self) -> None:
        """Fail the requests past their deadline (the oldest first), then look again shortly."""
        now = time.monotonic()
        expired = []
        for waiter, (deadline, conn) in self.pending.items():
            if deadline > now:
                break
            expired.append((waiter, conn))
        reason = f"no response within {self.timeout_s:g} s"
        for waiter, conn in expired:
            if conn is not None and conn.waiter is waiter:
                conn.fail("DEADLINE_EXCEEDED", reason)
            else:  # still connecting
                self.pending.pop(waiter, None)
                if not waiter.done():
                    waiter.set_exception(HttpFailure("DEADLINE_EXCEEDED", reason))
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(min(0.1, self.timeout_s / 20), self._sweep)

    def cancel(self, reason: str) -> None:
        """End every request in flight as ``CANCELLED`` (their connections closed)."""
        for task in list(self._connecting):
            task.cancel()
        for waiter, (_, conn) in list(self.pending.items()):
            if conn is not None and conn.waiter is waiter:
                conn.fail("CANCELLED", reason)
            else:
                self.pending.pop(waiter, None)
                if not waiter.done():
                    waiter.set_exception(HttpFailure("CANCELLED", reason))

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for task in list(self._connecting):
            task.cancel()
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        for _, conn in list(self.pending.values()):
            if conn is not None:
                conn.close()
