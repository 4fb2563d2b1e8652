"""A small real HTTP JSON service (aiohttp) for the ``netgain load --protocol http-json`` tests.

    python tests/http_app.py [--max-seconds S]

It binds 127.0.0.1 on a free port, prints ``PORT <n>`` on stdout, and stops on SIGTERM, when its
parent dies, or after ``--max-seconds``. Routes:

- ``GET /health``: 200 ``ok``;
- ``POST /predict``: ``{"image": base64}`` (or ``{"images": [base64, ...]}``) -> ``{"sizes": [...]}``;
  a body that is not such JSON is refused 400 with ``{"detail": ...}``. It answers with a
  ``Server-Timing`` header in netgain's phase names (queue, pre, kernel, post, total) and sleeps
  its ``kernel`` phase: 40 ms for every twentieth request (by the ``x-request-id``'s number),
  0.5 ms otherwise, so the slow tail is the kernel's;
- ``POST /rows``: ``{"rows": [[float, ...], ...]}`` -> ``{"sums": [...]}`` (tabular payloads);
- ``POST /fail``: 500 ``{"detail": "the model failed on purpose"}``;
- ``POST /slow``: answers after 2 s (for client deadlines).
- ``GET /count``: how many requests each route has answered, as JSON;
- ``GET /ids``: the ``x-request-id`` of every ``/predict`` request, as a JSON list.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import os
import signal
import sys
import time

from aiohttp import web

SLOW_EVERY = 20
SLOW_KERNEL_S = 0.040
FAST_KERNEL_S = 0.0005


def _index(request: web.Request) -> int:
    rid = request.headers.get("x-request-id", "")
    tail = rid.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _timing(phases_ms: dict[str, float]) -> str:
    total = sum(phases_ms.values())
    return ", ".join(f"{k};dur={v:.3f}" for k, v in {**phases_ms, "total": total}.items())


def build_app() -> web.Application:
    counts: collections.Counter[str] = collections.Counter()
    ids: list[str] = []

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def predict(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        counts["predict"] += 1
        ids.append(request.headers.get("x-request-id", ""))
        try:
            doc = await request.json()
            images = doc["images"] if "images" in doc else [doc["image"]]
            sizes = [len(base64.b64decode(i, validate=True)) for i in images]
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            return web.json_response({"detail": f"bad request body: {exc!r}"}, status=400)
        pre = time.perf_counter()
        kernel_s = SLOW_KERNEL_S if _index(request) % SLOW_EVERY == 0 else FAST_KERNEL_S
        await asyncio.sleep(kernel_s)
        kernel = time.perf_counter()
        phases = {"queue": 0.0, "pre": (pre - t0) * 1e3, "kernel": (kernel - pre) * 1e3, "post": 0.01}
        return web.json_response({"sizes": sizes}, headers={"Server-Timing": _timing(phases)})

    async def rows(request: web.Request) -> web.Response:
        counts["rows"] += 1
        doc = await request.json()
        return web.json_response({"sums": [sum(r) for r in doc["rows"]]})

    async def fail(request: web.Request) -> web.Response:
        counts["fail"] += 1
        await request.read()
        return web.json_response({"detail": "the model failed on purpose"}, status=500)

    async def slow(request: web.Request) -> web.Response:
        counts["slow"] += 1
        await request.read()
        await asyncio.sleep(2.0)
        return web.json_response({})

    async def count(request: web.Request) -> web.Response:
        return web.json_response(dict(counts))

    async def seen(request: web.Request) -> web.Response:
        return web.json_response(ids)

    app = web.Application(client_max_size=64 << 20)
    app.router.add_get("/health", health)
    app.router.add_post("/predict", predict)
    app.router.add_post("/rows", rows)
    app.router.add_post("/fail", fail)
    app.router.add_post("/slow", slow)
    app.router.add_get("/count", count)
    app.router.add_get("/ids", seen)
    return app


async def serve(max_seconds: float) -> None:
    runner = web.AppRunner(build_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and server.sockets  # type: ignore[attr-defined]
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    print(f"PORT {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent, deadline = os.getppid(), time.monotonic() + max_seconds
    # Polled: a parent that dies without a signal must stop this server too.
    while not stop.is_set() and os.getppid() == parent and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="stop after this long, whatever")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.max_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
