"""The master's own HTTP endpoints: Locust's web UI and the client metrics for Prometheus.

Both are bound before the run starts, so a taken port fails the run in one line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gevent
from gevent import pywsgi
from prometheus_client import CollectorRegistry, start_http_server

from netgain.errors import NetgainError


def start_web_ui(env: Any, host: str, port: int) -> Any:
    """Start Locust's web UI (bound here, so a taken port fails at once) and return it."""
    with locust_argv():
        web_ui = env.create_web_ui(host, port, delayed_start=True)
    build = web_ui.update_template_args

    def update_template_args() -> None:  # runs again on every GET /
        with locust_argv():
            build()

    web_ui.update_template_args = update_template_args
    # Locust's own start() binds inside a greenlet, where a taken port is only a logged
    # traceback; bound here, it fails the run in one line and port 0 can be reported.
    server = pywsgi.WSGIServer((host, port), web_ui.app, log=None, error_log=logging.getLogger("locust.web"))
    try:
        server.init_socket()
    except OSError as exc:
        raise NetgainError(bind_error("--web-ui", host, port, exc)) from exc
    web_ui.server = server
    web_ui.greenlet = gevent.spawn(server.serve_forever)
    return web_ui


def start_metrics(registry: CollectorRegistry, host: str, port: int) -> Any:
    """Serve ``registry`` on ``/metrics`` at host:port (0: any free port); returns the HTTP server."""
    try:
        httpd, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise NetgainError(bind_error("--metrics-port", host, port, exc)) from exc
    return httpd


def stop_metrics(httpd: Any) -> None:
    httpd.shutdown()
    httpd.server_close()


def bind_error(flag: str, host: str, port: int, exc: OSError) -> str:
    """``--metrics-port: cannot serve on 127.0.0.1:9465: Address already in use``."""
    return f"{flag}: cannot serve on {host}:{port}: {exc.strerror or exc}"


@contextmanager
def locust_argv() -> Iterator[None]:
    """Locust's web UI parses ``sys.argv`` as Locust's own flags whenever it builds its page (to
    list a locustfile's custom options); ours made it exit 2. It is shown no flags instead."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved
