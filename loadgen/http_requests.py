"""The HTTP requests ``netgain load`` sends, built from a request's payload items before the run:
KServe v2 REST inference bodies (``--protocol oip-http``: JSON tensors, or the binary-data
extension) and a user's request template (``--protocol http-json``: method, path, headers, a JSON
body with the payload put in, the expected status). See docs/loadgen.md.
"""

from __future__ import annotations

import base64
import json
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from netgain.protos import inference_pb2 as pb

HTTP_PROTOCOLS = ("oip-http", "http-json")
#: An FP32 tensor goes as JSON numbers up to this many bytes of JSON (``--oip-binary auto``), binary above.
AUTO_JSON_MAX_BYTES = 64 * 1024
# Headers the load generator writes itself: a template may not set them.
OWN_HEADERS = ("host", "content-length", "transfer-encoding", "connection", "x-request-id")
TEMPLATE_KEYS = ("method", "path", "headers", "body", "expect_status", "ready_path")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
BODYLESS = ("GET", "DELETE")

#: Body placeholders, each a JSON string in the template: ``"{name}"`` alone becomes the value (a
#: list, a number), inside a longer string the text (the one-item, text-valued ones only).
PLACEHOLDERS = {
    "payload_b64": "the item's bytes, base64 (a string)",
    "payloads_b64": "every item's bytes, base64 (a list of strings)",
    "payload_text": "the item as UTF-8 text (a string; --model text)",
    "payloads_text": "every item as text (a list of strings)",
    "features": "the item's feature vector (a list of numbers; --model tabular)",
    "features_rows": "every item's feature vector (a list of lists)",
    "items": "how many items the request carries (a number)",
    "payload": "the whole body is the item's raw bytes (application/octet-stream), not JSON",
}
ONE_ITEM = ("payload_b64", "payload_text", "features", "payload")
IN_TEXT = ("payload_b64", "payload_text", "items")
FEATURE_NAMES = ("features", "features_rows")
_TOKEN = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")

Headers = tuple[tuple[str, str], ...]
Encode = Callable[[list[pb.Input]], tuple[bytes, Headers]]


@dataclass(frozen=True)
class HttpRequest:
    """What every request of a run shares; ``encode`` makes the body (and its own headers, such as
    Content-Type) from the request's items."""

    method: str
    path: str
    headers: Headers
    expect: frozenset[int]
    encode: Encode


# -- --protocol http-json: the request template -------------------------------------------------------
def load_template(path: str) -> dict[str, Any]:
    """A request template file (JSON, or YAML when PyYAML is installed), checked and normalised:
    ``method`` (default POST), ``path``, ``headers``, ``body`` (absent: none), ``expect_status`` (a
    list, default [200]), ``ready_path`` (None). ValueError naming the file and what is wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ValueError(f"--request-template {path}: cannot read it ({exc.strerror or exc})") from None
    raw = _parse(path, text)
    try:
        return normalise_template(raw)
    except ValueError as exc:
        raise ValueError(f"--request-template {path}: {exc}") from None


def _parse(path: str, text: str) -> Any:
    if os.path.splitext(path)[1].lower() not in (".yaml", ".yml"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--request-template {path}: not valid JSON ({exc})") from None
    try:
        import yaml
    except ImportError:
        raise ValueError(
            f"--request-template {path}: YAML needs PyYAML (pip install pyyaml); or write it as JSON"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        why = " ".join(str(exc).split())
        raise ValueError(f"--request-template {path}: not valid YAML ({why})") from None


def normalise_template(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError("expected a mapping with method, path, headers, body, expect_status")
    unknown = sorted(set(raw) - set(TEMPLATE_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; the keys are {', '.join(TEMPLATE_KEYS)}")
    method = str(raw.get("method", "POST")).upper()
    if method not in METHODS:
        raise ValueError(f"method {method!r}: use one of {', '.join(METHODS)}")
    path = _path(raw.get("path"), "path")
    ready = raw.get("ready_path")
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict):
        raise ValueError("headers: expected a mapping of name: value")
    clean: dict[str, str] = {}
    for name, value in headers.items():
        name, value = str(name).strip(), str(value)
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name) or "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r}: not a valid header name and one-line value")
        if name.lower() in OWN_HEADERS:
            raise ValueError(f"header {name!r} is written by the load generator; leave it out")
        clean[name] = value
    expect = raw.get("expect_status", 200)
    codes = expect if isinstance(expect, list) else [expect]
    if not codes or not all(isinstance(c, int) and not isinstance(c, bool) and 100 <= c < 600 for c in codes):
        raise ValueError(f"expect_status {expect!r}: an HTTP status (100-599) or a list of them")
    out: dict[str, Any] = {
        "method": method,
        "path": path,
        "headers": clean,
        "expect_status": sorted(set(codes)),
        "ready_path": None if ready is None else _path(ready, "ready_path"),
    }
    if raw.get("body") is not None:
        if method in BODYLESS:
            raise ValueError(f"a {method} request has no body; use POST or PUT, or leave body out")
        body = raw["body"]
        raw_body = body == "{payload}"
        if not raw_body and "{payload}" in json.dumps(body):
            raise ValueError('"{payload}" (the raw bytes) must be the whole body: body: "{payload}"')
        _check_in_text(body)
        out["body"] = body
    return out


def _path(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or any(c.isspace() for c in value):
        raise ValueError(f"{key} {value!r}: expected a path that starts with / (a query may follow)")
    return value


def _check_in_text(value: Any) -> None:
    """List-valued placeholders can only stand alone in their string."""
    if isinstance(value, str):
        names = _TOKEN.findall(value)
        bad = [n for n in names if n not in IN_TEXT] if names and not _TOKEN.fullmatch(value) else []
        if bad:
            token = f'"{{{bad[0]}}}"'
            raise ValueError(f"{token} is a list or raw bytes: it must be a whole string, {token}")
    elif isinstance(value, list):
        for v in value:
            _check_in_text(v)
    elif isinstance(value, dict):
        for v in value.values():
            _check_in_text(v)


def placeholders(template: dict[str, Any]) -> set[str]:
    """The placeholders a template's body uses."""
    return set(_TOKEN.findall(json.dumps(template.get("body"))))


def check_template(template: dict[str, Any], features: bool | None, max_items: int) -> None:
    """A template's placeholders against the payloads: ``features`` whether they are feature vectors
    (tabular) or bytes (None: not known before the handler is built), ``max_items`` the most items a
    request carries. ValueError saying what to change."""
    used = placeholders(template)
    one = sorted(used & set(ONE_ITEM))
    if max_items > 1 and one:
        plural = {"payload_b64": "payloads_b64", "payload_text": "payloads_text", "features": "features_rows"}
        fix = f"use {{{plural[one[0]]}}}" if one[0] in plural else "send one item per request (--items 1)"
        raise ValueError(f"{{{one[0]}}} carries one item, but --items sends up to {max_items}: {fix}")
    if features is None:
        return
    misfits = used - set(FEATURE_NAMES) - {"items"} if features else used & set(FEATURE_NAMES)
    wrong = sorted(misfits)
    if wrong:
        what = "feature vectors (--model tabular)" if features else "bytes (image, text, null)"
        raise ValueError(f"{{{wrong[0]}}} does not suit this --model: its payloads are {what}")


def _value(name: str, inputs: list[pb.Input]) -> Any:
    if name == "items":
        return len(inputs)
    if name in FEATURE_NAMES:
        if any(not i.features for i in inputs):
            raise ValueError(f"{{{name}}} needs feature-vector payloads (--model tabular)")
        rows = [list(i.features) for i in inputs]
        return rows[0] if name == "features" else rows
    if any(not i.data for i in inputs) and any(i.features for i in inputs):
        raise ValueError(f"{{{name}}} needs byte payloads (image, text, null); tabular makes {{features}}")
    if name in ("payload_b64", "payloads_b64"):
        texts = [base64.b64encode(i.data).decode("ascii") for i in inputs]
    else:
        try:
            texts = [i.data.decode("utf-8") for i in inputs]
        except UnicodeDecodeError:
            why = f"{{{name}}}: the payload is not UTF-8 text (--model text); use {{payload_b64}}"
            raise ValueError(why) from None
    return texts[0] if name == "payload_b64" or name == "payload_text" else texts


def render(value: Any, inputs: list[pb.Input]) -> Any:
    """The template body with each placeholder replaced by the items' value."""
    if isinstance(value, str):
        whole = _TOKEN.fullmatch(value)
        if whole:
            return _value(whole.group(1), inputs)
        return _TOKEN.sub(lambda m: str(_value(m.group(1), inputs)), value)
    if isinstance(value, list):
        return [render(v, inputs) for v in value]
    if isinstance(value, dict):
        return {k: render(v, inputs) for k, v in value.items()}
    return value


def template_request(template: dict[str, Any]) -> HttpRequest:
    """The request a normalised template describes."""
    headers = dict(template["headers"])
    has_type = any(k.lower() == "content-type" for k in headers)
    body = template.get("body")
    raw = body == "{payload}"
    if body is not None and not has_type:
        headers["Content-Type"] = "application/octet-stream" if raw else "application/json"

    def encode(inputs: list[pb.Input]) -> tuple[bytes, Headers]:
        if body is None:
            return b"", ()
        if raw:
            if len(inputs) != 1:
                raise ValueError('a raw "{payload}" body carries one item: send --items 1')
            if not inputs[0].data:
                raise ValueError('"{payload}" needs byte payloads (image, text, null)')
            return inputs[0].data, ()
        return json.dumps(render(body, inputs), separators=(",", ":")).encode(), ()

    return HttpRequest(
        method=template["method"],
        path=template["path"],
        headers=tuple(headers.items()),
        expect=frozenset(template["expect_status"]),
        encode=encode,
    )


# -- --protocol oip-http: KServe v2 REST ------------------------------------------------------------
def oip_path(model: str) -> str:
    return f"/v2/models/{quote(model, safe='')}"


def oip_http_request(options: dict[str, str], binary: str = "auto") -> HttpRequest:
    """KServe v2 ``POST /v2/models/{model}/infer`` for the model's one input tensor (``oip.*``
    options, from its metadata). ``binary``: ``always`` the binary-data extension (the JSON header,
    then the tensor's bytes; ``Inference-Header-Content-Length`` says where the header ends),
    ``never`` JSON only (BYTES items must then be UTF-8 text), ``auto`` binary for BYTES and for
    FP32 tensors of more than ``AUTO_JSON_MAX_BYTES`` of JSON. Outputs are asked for in binary
    whenever the request is (the server then has the extension)."""
    name, datatype = options["oip.input"], options["oip.datatype"]
    declared = [int(d) for d in options["oip.shape"].split(",") if d]

    def encode(inputs: list[pb.Input]) -> tuple[bytes, Headers]:
        n = len(inputs)
        if datatype == "FP32":
            width = len(inputs[0].features) if inputs else 0
            shape = [n, width]
            values: list[Any] = [v for i in inputs for v in i.features]
            blob = struct.pack(f"<{len(values)}f", *values)
        else:
            shape = [n] + [1] * max(0, len(declared) - 1)
            items = [i.data for i in inputs]
            blob = b"".join(struct.pack("<I", len(d)) + d for d in items)
            values = []
            if binary == "never":
                try:
                    values = [d.decode("utf-8") for d in items]
                except UnicodeDecodeError:
                    raise ValueError(
                        "--oip-binary never: these payloads are not UTF-8 text; BYTES such as images "
                        "need the binary-data extension (--oip-binary auto)"
                    ) from None
        tensor: dict[str, Any] = {"name": name, "shape": shape, "datatype": datatype}
        if binary == "never" or (binary == "auto" and datatype == "FP32"):
            doc = json.dumps({"inputs": [{**tensor, "data": values}]}, separators=(",", ":")).encode()
            if binary == "never" or len(doc) <= AUTO_JSON_MAX_BYTES:
                return doc, (("Content-Type", "application/json"),)
        tensor["parameters"] = {"binary_data_size": len(blob)}
        head = {"inputs": [tensor], "parameters": {"binary_data_output": True}}
        header = json.dumps(head, separators=(",", ":")).encode()
        return header + blob, (
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", str(len(header))),
        )

    return HttpRequest(
        method="POST",
        path=f"{oip_path(options['oip.model'])}/infer",
        headers=(),
        expect=frozenset({200}),
        encode=encode,
    )
