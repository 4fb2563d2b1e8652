"""The engine's HTTP sender (``--protocol oip-http`` and ``http-json``): each request's bytes built
before the run (all but its ``x-request-id``), sent on ``http_client``'s keep-alive connections.

An answer with an expected status is ``OK``; any other keeps its HTTP status and a short reason,
its code mapped as gRPC-over-REST gateways do (``status_code``), so the report's errors, the exit
status and "TARGET WENT AWAY" read HTTP runs as they read gRPC ones. A ``Server-Timing`` header
fills the server's phase columns as netgain's ``server-timing`` trailer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import ssl

import numpy as np

from netgain.contract.messages import Plan
from netgain.loadgen.http_requests import BODYLESS, HttpRequest, oip_http_request, template_request
from netgain.loadgen.payloads import PayloadFactory
from netgain.loadgen.runner.http_client import Answer, HttpFailure, HttpPool
from netgain.loadgen.runner.sender import NO_ANSWER, Outcome, one_line, server_columns

WARM_S = 2.0  # longest wait for the connections opened before the run

#: HTTP status -> the code a record carries (google.rpc's HTTP mapping, read backwards; 413 as gRPC
#: names a message over its size limit). Any other status is UNKNOWN; the record keeps it.
HTTP_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    412: "FAILED_PRECONDITION",
    413: "RESOURCE_EXHAUSTED",
    415: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def status_code(http_status: int) -> str:
    return HTTP_CODES.get(http_status, "UNKNOWN")


# The start of a JSON body's reason, for a body cut at KEEP_BODY bytes (no longer a JSON document).
_REASON = re.compile(r'^\{\s*"(?:error|detail|message)"\s*:\s*"((?:[^"\\]|\\.)*)')


def answer_reason(answer: Answer) -> str:
    """Why an answer failed, in the server's words: a JSON body's ``error`` (KServe v2, Triton),
    ``detail`` (FastAPI) or ``message``; else the body's text; else the reason phrase."""
    text = answer.body.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        with contextlib.suppress(ValueError):
            doc = json.loads(text)
            for key in ("error", "detail", "message"):
                if isinstance(doc, dict) and doc.get(key):
                    value = doc[key]
                    return value if isinstance(value, str) else json.dumps(value)
        cut = _REASON.match(text)
        if cut:
            return cut.group(1).replace("\\n", " ").replace('\\"', '"')
    return text or answer.phrase


def split_target(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def raise_fd_limit(need: int) -> None:
    """One socket per request in flight: lift the soft open-files limit (1,024 by default) toward
    ``need``, as far as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if want > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def request_for(plan: Plan) -> HttpRequest:
    if plan.protocol == "oip-http":
        return oip_http_request(plan.handler_options, str(plan.http.get("binary", "auto")))
    return template_request(plan.http)


class HttpSender:
    """Requests to target ``idx % targets``; a message is (bytes after the ``x-request-id`` value,
    body size)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.payloads = PayloadFactory(
            plan.model, plan.handler_options, plan.seed, variants=int(plan.extra.get("payload_variants", 8))
        )
        self.request = request_for(plan)
        r = self.request
        # Everything before the request id's number: the request line, Host, and the id's prefix.
        self.heads = [
            f"{r.method} {r.path} HTTP/1.1\r\nHost: {t}\r\nx-request-id: {plan.run_id}-".encode("latin-1")
            for t in plan.targets
        ]
        self._messages: dict[tuple[int, int, int], tuple[bytes, int]] = {}
        self.pools: list[HttpPool] = []

    def build(self, index: np.ndarray, size: np.ndarray, items: np.ndarray) -> list[tuple[bytes, int]]:
        out = []
        for i, s, k in zip(index, size, items, strict=True):
            key = self.payloads.key(int(i), int(s), int(k))
            message = self._messages.get(key)
            if message is None:
                message = self._messages[key] = self._message(key)
            out.append(message)
        return out

    def _message(self, key: tuple[int, int, int]) -> tuple[bytes, int]:
        body, own = self.request.encode(self.payloads.inputs(key))
        headers = [*self.request.headers, *own]
        if body or self.request.method not in BODYLESS:
            headers.append(("Content-Length", str(len(body))))
        head = "".join(f"{k}: {v}\r\n" for k, v in headers)
        return b"\r\n" + head.encode("latin-1") + b"\r\n" + body, len(body)

    def size(self, message: tuple[bytes, int]) -> int:
        return message[1]

    async def open(self) -> None:
        plan = self.plan
        raise_fd_limit(plan.max_in_flight * len(plan.targets) + 256)
        tls = ssl.create_default_context(cafile=plan.tls_ca) if plan.tls_ca else None
        for t in plan.targets:
            host, port = split_target(t)
            self.pools.append(HttpPool(host, port, plan.timeout_s, tls))
        await asyncio.gather(*(p.warm(max(1, plan.connections), WARM_S) for p in self.pools))

    def start(self, message: tuple[bytes, int], idx: int, target: int) -> asyncio.Future[Answer]:
        return self.pools[target].request(b"".join((self.heads[target], b"%d" % idx, message[0])))

    async def finish(self, waiter: asyncio.Future[Answer]) -> Outcome:
        try:
            answer = await waiter
        except HttpFailure as failure:
            return failure.code, 0, {**NO_ANSWER, "error": failure.reason}
        server = server_columns(answer.timing)
        server["http_status"] = answer.status
        if answer.status in self.request.expect:
            return "OK", answer.size, server
        server["error"] = one_line(f"HTTP {answer.status}: {answer_reason(answer)}")
        return status_code(answer.status), 0, server

    def cancel(self) -> None:
        for pool in self.pools:
            pool.cancel("cancelled after the stop's drain")

    async def close(self) -> None:
        for pool in self.pools:
            pool.close()
