"""Canned null targets for the load generator's benchmarks: servers that answer every request with
the same bytes, so a server costs little per request and the figure measured is the load
generator's, for each protocol alike.

HTTP (asyncio): KServe v2 REST for one model, ``null`` (readiness, metadata: one BYTES input,
``POST /v2/models/null/infer``), and ``POST /predict`` (a JSON endpoint for ``--protocol
http-json``), every answer with a ``Server-Timing`` header in netgain's own format; anything else
gets 404. HTTP/1.1 keep-alive, requests with a Content-Length body (as netgain load sends them).

gRPC (grpc.aio): ``grpc.health.v1`` SERVING, netgain.v1 ``ServerInfo`` (model null, no metrics
port) and ``Infer`` with a fixed response and netgain's ``server-timing`` trailer.

    python benchmarks/null_targets.py [--grpc]     # one server; prints "PORT <n>"
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


async def serve_http() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Canned, "127.0.0.1", 0, backlog=4096)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    parent = os.getppid()
    while os.getppid() == parent:  # stop with the benchmark that started it
        await asyncio.sleep(0.5)


async def serve_grpc() -> None:
    import grpc
    from grpc_health.v1 import health_pb2

    from netgain.protos import pb
    from netgain.protos.service import SERVICE_NAME

    status = health_pb2.HealthCheckResponse.SERVING
    serving = health_pb2.HealthCheckResponse(status=status).SerializeToString()
    info = pb.ServerInfoResponse(model="null", handler="null", metrics_port=-1, ready=True)
    info_bytes = info.SerializeToString()
    answer = pb.InferResponse(outputs=[pb.Output(label=64)]).SerializeToString()
    trailer = (("server-timing", TIMING.decode()),)

    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return serving

    async def server_info(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return info_bytes

    async def infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        context.set_trailing_metadata(trailer)
        return answer

    def unary(fn: object) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(fn)  # bytes in, bytes out

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": unary(check)}),
            grpc.method_handlers_generic_handler(
                SERVICE_NAME, {"ServerInfo": unary(server_info), "Infer": unary(infer)}
            ),
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"PORT {port}", flush=True)
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    await server.stop(0)


def canned_servers(
    stack: contextlib.ExitStack, count: int, grpc: bool = False, cpus: str | None = None
) -> str:
    """``count`` canned server processes (HTTP, or gRPC) on ports of their own, on ``cpus`` (a
    taskset list) when given; the comma-joined target."""
    targets = []
    for _ in range(count):
        pin = ["taskset", "-c", cpus] if cpus else []
        cmd = [*pin, sys.executable, __file__, *(["--grpc"] if grpc else [])]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        line = proc.stdout.readline()
        if not line.startswith("PORT ") or time.monotonic() > deadline:
            raise SystemExit(f"canned server did not start: {line!r}")
        targets.append(f"127.0.0.1:{int(line.split()[1])}")
    return ",".join(targets)


if __name__ == "__main__":
    asyncio.run(serve_grpc() if "--grpc" in sys.argv[1:] else serve_http())
