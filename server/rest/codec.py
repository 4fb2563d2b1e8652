"""KServe v2 REST bodies (the Open Inference Protocol over HTTP) to handler items, and outputs back.

A request body is a JSON object (``id``, ``parameters``, ``inputs``, ``outputs``); with the binary
tensor data extension the ``Inference-Header-Content-Length`` header gives the JSON's length and
the tensors' bytes follow it, each input declaring its share in ``parameters.binary_data_size``
(BYTES elements each a 4-byte little-endian length, then the bytes, as gRPC's raw contents; FP32
little-endian). The tensors are those of the gRPC service (server/oip.py), checked by the same
functions: the shape's element count against ``--max-items-per-request`` before the data is looked
at, then the data's against the shape. JSON ``data`` may be flat or nested (row-major); BYTES
elements are strings (sent as UTF-8), FP32 elements numbers.

An output is answered in the JSON (``data``) unless binary is asked for: the request parameter
``binary_data_output`` for every output, an output's ``binary_data`` for that one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netgain.protos import inference_pb2 as pb
from netgain.server.oip import (
    INPUT_NAME,
    VERSION,
    BadTensor,
    ModelIO,
    bytes_items,
    check_outputs,
    check_tensor,
    feature_items,
    one_tensor,
    output_tensors,
    raw_fp32,
)

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"


@dataclass
class InferBody:
    """An infer request, read: its handler items and how its outputs are to be answered."""

    inputs: list[pb.Input]
    outputs: list[str] = field(default_factory=list)  # the names asked for, in order; [] = all
    binary: dict[str, bool] = field(default_factory=dict)  # per output asked: binary or JSON
    binary_default: bool = False  # parameters.binary_data_output: for outputs not named


# json.loads makes an object per value, up to ~20 times the text's size (3-byte "[],"), on the event
# loop: a JSON part over SCAN_ABOVE bytes has its values counted first (separators and openers
# outside strings), and more than the request's items could need is refused unparsed.
SCAN_ABOVE = 1 << 20
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def _separators(text: bytes) -> int:
    return text.count(b",") + text.count(b"[") + text.count(b"{") + 1


def json_values(text: bytes, limit: int) -> int:
    """About the values ``json.loads(text)`` would make (an object's keys aside), exact enough to
    compare with ``limit``: separators and openers, counted again outside strings only when there
    are more than ``limit`` (strings of text hold commas)."""
    n = _separators(text)
    return n if n <= limit else _separators(_STRING.sub(b'""', text))


def max_json_values(io: ModelIO, max_items: int) -> int:
    """Values a request of ``max_items`` items may hold in JSON (rows nested, with room to spare)."""
    return 4 * max_items * max(1, io.features) + 4096


def split_body(
    body: bytes, header_length: str | None, max_values: int | None = None
) -> tuple[dict[str, Any], bytes]:
    """(the JSON header as a dict, the binary part) of a request body; a large JSON part holding
    more than ``max_values`` values is refused before it is parsed."""
    size = len(body)
    if header_length is None:
        cut = size
    else:
        try:
            cut = int(header_length)
        except ValueError:
            raise BadTensor(f"{HEADER_LENGTH} {header_length!r} is not a whole number") from None
        if not 0 <= cut <= size:
            raise BadTensor(f"{HEADER_LENGTH} {cut} is outside the body's {size} bytes")
    text = body[:cut]
    if max_values is not None and cut > SCAN_ABOVE and (n := json_values(text, max_values)) > max_values:
        raise BadTensor(
            f"the request's JSON holds up to {n} values, more than {max_values} that this model's "
            "--max-items-per-request can need; send tensors as binary data (binary_data_size)"
        )
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        where = f"the first {cut} bytes (by {HEADER_LENGTH})" if header_length is not None else "the body"
        raise BadTensor(f"{where} are not a JSON object: {exc}") from None
    if not isinstance(header, dict):
        raise BadTensor("the request body must be a JSON object with 'inputs'")
    return header, body[cut:]


def body_id(header: dict[str, Any]) -> str:
    """The request's ``id`` ("" when absent)."""
    rid = header.get("id", "")
    if not isinstance(rid, str):
        raise BadTensor(f"'id' must be a string, not {type(rid).__name__}")
    return rid


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadTensor(f"{what} must be a JSON object")
    return value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flatten(data: Any, limit: int) -> list[Any]:
    """A nested list's leaves in row-major order; stops past ``limit`` (the caller says too many)."""
    if not isinstance(data, list):
        raise BadTensor(f"input {INPUT_NAME!r}: data must be a JSON list")
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
            if len(out) > limit:
                return out
        else:
            stack.pop()
    return out


def _same_count(shape: list[int], count: int, got: int, what: str) -> None:
    if got != count:
        more = "more" if got > count else str(got)  # _flatten stops one past the count
        raise BadTensor(f"input shape {shape} holds {count} {what}, the data {more}")


def read_infer(header: dict[str, Any], binary: bytes, io: ModelIO, max_items: int | None) -> InferBody:
    """The request's handler items and output choices; BadTensor names what does not fit."""
    inputs = header.get("inputs")
    if not isinstance(inputs, list):
        raise BadTensor(f"'inputs' must be a list of tensors; this model takes {io.describe()}")
    one_tensor(len(inputs), io)
    tensor = _object(inputs[0], "an input tensor")
    name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise BadTensor(f"an input tensor needs a 'name' and a 'datatype'; this model takes {io.describe()}")
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise BadTensor(f"input {name!r}: 'shape' must be a list of whole numbers")
    size = _object(tensor.get("parameters"), f"input {name!r}: 'parameters'").get("binary_data_size")
    if size is not None and not (_whole(size) and size >= 0):
        raise BadTensor(f"input {name!r}: binary_data_size must be a whole number of bytes")
    has_data = "data" in tensor
    if size is not None and has_data:
        raise BadTensor(f"input {name!r} has both data and binary_data_size: send one")
    if size is None and not has_data:
        raise BadTensor(f"input {name!r} has no data: send data, or binary_data_size and the bytes")
    if len(binary) != (size or 0):
        raise BadTensor(
            f"the body's binary part is {len(binary)} bytes; the input declares {size or 0} "
            "(binary_data_size)"
        )
    count = check_tensor(1, name, datatype, shape, io, max_items)
    if io.datatype == "BYTES":
        if size is not None:
            items = bytes_items(shape, count, binary)
        else:
            elements = _flatten(tensor["data"], count)
            _same_count(shape, count, len(elements), "elements")  # before any element is encoded
            if not all(isinstance(e, str) for e in elements):
                raise BadTensor(
                    f"input {name!r}: BYTES data in JSON are strings; send other bytes as binary data"
                )
            items = bytes_items(shape, count, None, [e.encode("utf-8", "surrogatepass") for e in elements])
    else:
        if size is not None:
            values = raw_fp32(shape, count, binary)
        else:
            flat = _flatten(tensor["data"], count)
            _same_count(shape, count, len(flat), "values")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
                raise BadTensor(f"input {name!r}: FP32 data must be numbers")
            values = np.asarray(flat, dtype=np.float32)
        items = feature_items(values, io)
    return _outputs(header, InferBody(items))


def _outputs(header: dict[str, Any], body: InferBody) -> InferBody:
    params = _object(header.get("parameters"), "the request's 'parameters'")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise BadTensor("binary_data_output must be true or false")
    body.binary_default = binary_default
    asked = header.get("outputs", [])
    if not isinstance(asked, list):
        raise BadTensor("'outputs' must be a list of {'name': ...}")
    for out in asked:
        out = _object(out, "a requested output")
        name = out.get("name")
        if not isinstance(name, str):
            raise BadTensor("a requested output needs a 'name'")
        check_outputs([name])
        oparams = _object(out.get("parameters"), f"output {name!r}: 'parameters'")
        if "classification" in oparams:
            raise BadTensor(f"output {name!r}: classification is not served; LABEL holds the top class")
        binary = oparams.get("binary_data", body.binary_default)
        if not isinstance(binary, bool):
            raise BadTensor(f"output {name!r}: binary_data must be true or false")
        body.outputs.append(name)
        body.binary[name] = binary
    return body


def encode_response(
    model: str, request_id: str, outputs: list[pb.Output], asked: InferBody | None
) -> tuple[bytes, int | None]:
    """(the response body, the JSON part's length when binary outputs follow it, else None)."""
    names: Sequence[str] = asked.outputs if asked is not None else ()
    head: dict[str, Any] = {"model_name": model, "model_version": VERSION}
    if request_id:
        head["id"] = request_id
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, datatype, values in output_tensors(outputs, names):
        t: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(values.shape)}
        binary = asked is not None and asked.binary.get(name, asked.binary_default)
        if binary:
            raw = values.tobytes()
            t["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            t["data"] = values.reshape(-1).tolist()
        tensors.append(t)
    head["outputs"] = tensors
    text = json.dumps(head, separators=(",", ":")).encode("utf-8")
    if not blobs:
        return text, None
    return b"".join([text, *blobs]), len(text)


def error_body(message: str, code: str) -> bytes:
    """The protocol's error object, plus the gRPC status name (503 is UNAVAILABLE or RESOURCE_EXHAUSTED)."""
    return json.dumps({"error": message, "code": code}, separators=(",", ":")).encode("utf-8")
