"""Null HTTP servers for the load generator's HTTP benchmarks: canned answers on asyncio, so the
server costs a few µs per request and the figure measured is the load generator's.

Each process answers KServe v2 REST for one model, ``null`` (readiness, metadata: one BYTES input,
``POST /v2/models/null/infer``), and ``POST /predict`` (a JSON endpoint for ``--protocol
http-json``), every answer with a ``Server-Timing`` header in netgain's own format; anything else
gets 404. HTTP/1.1 keep-alive, requests with a Content-Length body (as netgain load sends them).

    python benchmarks/http_null.py            # one server; prints "PORT <n>"
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

TIMING = (
    b"queue;dur=0.010, pre;dur=0.010, h2d;dur=0.000, kernel;dur=0.010, d2h;dur=0.000, "
    b"post;dur=0.010, total;dur=0.040, batch;id=-1;size=1"
)
METADATA = json.dumps(
    {
        "name": "null",
        "versions": ["1"],
        "platform": "canned",
        "inputs": [{"name": "payload", "datatype": "BYTES", "shape": [-1, -1]}],
        "outputs": [{"name": "length", "datatype": "INT64", "shape": [-1, 1]}],
    }
).encode()
INFER = b'{"model_name":"null","outputs":[{"name":"length","datatype":"INT64","shape":[1,1],"data":[64]}]}'


def _answer(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nServer-Timing: " + TIMING
        + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


ROUTES = {
    (b"GET", b"/v2/health/ready"): _answer(b"200 OK", b""),
    (b"GET", b"/v2/models/null/ready"): _answer(b"200 OK", b""),
    (b"GET", b"/v2/models/null"): _answer(b"200 OK", METADATA),
    (b"GET", b"/"): _answer(b"200 OK", b"{}"),
    (b"POST", b"/v2/models/null/infer"): _answer(b"200 OK", INFER),
    (b"POST", b"/predict"): _answer(b"200 OK", b'{"label":1}'),
}
NOT_FOUND = _answer(b"404 Not Found", b'{"error":"no such route"}')


class Canned(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            length = 0
            at = head.lower().find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else None])
            if len(buf) < end + 4 + length:
                break
            method, _, rest = head.partition(b" ")
            path = rest.partition(b" ")[0]
            out.append(ROUTES.get((method, path), NOT_FOUND))
            buf = buf[end + 4 + length :]
        self.buf = buf
        if out:
            self.transport.write(b"".join(out))


async def serve() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Canned, "127.0.0.1", 0, backlog=4096)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    parent = os.getppid()
    while os.getppid() == parent:  # stop with the benchmark that started it
        await asyncio.sleep(0.5)


def http_null_servers(stack: contextlib.ExitStack, count: int) -> str:
    """``count`` null HTTP server processes on ports of their own; the comma-joined target."""
    targets = []
    for _ in range(count):
        proc = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, text=True)
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        line = proc.stdout.readline()
        if not line.startswith("PORT ") or time.monotonic() > deadline:
            raise SystemExit(f"null HTTP server did not start: {line!r}")
        targets.append(f"127.0.0.1:{int(line.split()[1])}")
    return ",".join(targets)


if __name__ == "__main__":
    asyncio.run(serve())
