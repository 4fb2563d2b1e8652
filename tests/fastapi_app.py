"""A small real FastAPI service under uvicorn, for ``netgain load --protocol http-json`` tests.

    python tests/fastapi_app.py [--max-seconds S]

It binds 127.0.0.1 on a free port, prints ``PORT <n>`` on stdout once uvicorn serves, and stops on
SIGTERM or SIGINT, when its parent dies, or after ``--max-seconds``. Routes:

- ``GET /health``: 200 ``{"status": "ok"}``;
- ``POST /predict``: ``{"image": base64}`` -> ``{"width": w, "height": h, "bytes": n}``. A body
  that is not such JSON is refused 422 by FastAPI's validation, bad base64 400, an image that is
  not a JPEG 415 (each with ``{"detail": ...}``). Its ``kernel`` phase sleeps 40 ms for every
  twentieth request (by the ``x-request-id``'s number), 0.5 ms otherwise, so the slow tail is the
  kernel's;
- ``GET /count``: how many ``/predict`` requests it has answered, as JSON;
- ``GET /ids``: the ``x-request-id`` of every ``/predict`` request, as a JSON list.

A middleware answers every request with a ``Server-Timing`` header in netgain's phase names
(netgain/contract/phases.py: queue, pre, kernel, post, total) and echoes its ``x-request-id``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import io
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable

import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel

HOST = "127.0.0.1"
CallNext = Callable[[Request], Awaitable[Response]]
SLOW_EVERY = 20
SLOW_KERNEL_S = 0.040
FAST_KERNEL_S = 0.0005


class PredictRequest(BaseModel):
    image: str


def _index(request: Request) -> int:
    tail = request.headers.get("x-request-id", "").rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _timing(phases_ms: dict[str, float]) -> str:
    return ", ".join(f"{name};dur={ms:.3f}" for name, ms in phases_ms.items())


def build_app() -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    ids: list[str] = []

    @app.middleware("http")
    async def server_timing(request: Request, call_next: CallNext) -> Response:
        t0 = time.perf_counter()
        request.state.t0 = t0
        response = await call_next(request)
        done = time.perf_counter()
        # The handler's own phases; a request refused before its kernel ran has only a total.
        phases: dict[str, float] = dict(getattr(request.state, "phases", {}))
        if phases:
            phases["post"] = (done - request.state.handler_end) * 1e3
        response.headers["Server-Timing"] = _timing({**phases, "total": (done - t0) * 1e3})
        if "x-request-id" in request.headers:
            response.headers["x-request-id"] = request.headers["x-request-id"]
        return response

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/predict")
    async def predict(body: PredictRequest, request: Request) -> dict[str, int]:
        start = time.perf_counter()
        ids.append(request.headers.get("x-request-id", ""))
        try:
            data = base64.b64decode(body.image, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise HTTPException(400, f"image is not base64: {exc}") from None
        try:
            with Image.open(io.BytesIO(data)) as img:  # reads the header only
                fmt, (width, height) = img.format, img.size
        except UnidentifiedImageError:
            fmt, width, height = None, 0, 0
        if fmt != "JPEG":
            raise HTTPException(415, f"image is not a JPEG ({fmt or 'unknown format'}, {len(data)} bytes)")
        pre = time.perf_counter()
        await asyncio.sleep(SLOW_KERNEL_S if _index(request) % SLOW_EVERY == 0 else FAST_KERNEL_S)
        kernel = time.perf_counter()
        # queue: routing, reading and validating the body before this handler ran.
        request.state.phases = {
            "queue": (start - request.state.t0) * 1e3,
            "pre": (pre - start) * 1e3,
            "kernel": (kernel - pre) * 1e3,
        }
        request.state.handler_end = kernel
        return {"width": width, "height": height, "bytes": len(data)}

    @app.get("/count")
    async def count() -> dict[str, int]:
        return {"predict": len(ids)}

    @app.get("/ids")
    async def seen() -> list[str]:
        return ids

    return app


async def serve(max_seconds: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    config = uvicorn.Config(
        build_app(), log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)  # handles SIGTERM and SIGINT itself: should_exit

    async def watch() -> None:
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.01)
        if not server.started:
            return
        print(f"PORT {sock.getsockname()[1]}", flush=True)
        parent, deadline = os.getppid(), time.monotonic() + max_seconds
        # Polled: a parent that dies without a signal must stop this server too.
        while not server.should_exit and os.getppid() == parent and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        server.should_exit = True

    watcher = asyncio.create_task(watch())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="stop after this long, whatever")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.max_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
