"""The Open Inference Protocol (KServe v2 gRPC, ``inference.GRPCInferenceService``) beside netgain.v1.

``ModelInfer`` turns the request's input tensor into the handler's ``pb.Input`` items and enqueues
them through ``InferenceServicer.infer_items``, the path ``Infer`` takes: the same request id
(``x-request-id``, else the request's ``id``), admission, queue, batching, span log, metrics and
trailers (``server-timing``, ``x-request-id``), in the one-process server and in each ``--workers``
frontend alike. Tensors, one item per row:

- BYTES models (image: encoded JPEG/PNG; text: UTF-8; null: anything): input ``INPUT``, BYTES,
  shape ``[n]`` (or ``[n, 1]``): each element is one item's ``data``.
- feature models (tabular): input ``INPUT``, FP32, shape ``[n, features]``: each row one item.
- outputs ``LABEL`` (INT64 ``[n]``) and ``SCORE`` (FP32 ``[n]``), in ``raw_output_contents``, plus
  ``VALUES`` (FP32 ``[n, k]``) for a handler whose outputs carry values.

Either ``contents`` or ``raw_input_contents`` carries the input (tritonclient sends the latter), never
both. The element counts (the shape's and the data's) are checked against ``--max-items-per-request``
before any element becomes a Python object.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from netgain.protos import inference_pb2 as pb
from netgain.protos import oip_pb2 as oip
from netgain.server.service import InferenceServicer

INPUT_NAME = "INPUT"
VERSION = "1"
_LEN = struct.Struct("<I")


class BadTensor(ValueError):
    """The request's tensors do not fit the model: INVALID_ARGUMENT with this message."""


@dataclass(frozen=True)
class ModelIO:
    """The served model's tensors, as ModelMetadata declares them."""

    datatype: str  # "BYTES" or "FP32"
    features: int = 0  # FP32: the row width

    @property
    def input_shape(self) -> list[int]:
        return [-1, self.features] if self.datatype == "FP32" else [-1]

    def describe(self) -> str:
        return f"{INPUT_NAME!r} ({self.datatype} {self.input_shape})"


def model_io(handler: Any) -> ModelIO:
    """From the handler's own example payload: feature vectors are FP32 rows, anything else BYTES."""
    example = handler.example_input(random.Random(0))
    if len(example.features) and not example.data:
        return ModelIO("FP32", len(example.features))
    return ModelIO("BYTES")


def split_bytes(raw: bytes, limit: int | None = None) -> list[bytes]:
    """A raw BYTES tensor: each element a 4-byte little-endian length, then that many bytes;
    BadTensor as soon as it holds more than ``limit`` elements."""
    out: list[bytes] = []
    view = memoryview(raw)
    at = 0
    while at < len(view):
        if limit is not None and len(out) >= limit:
            raise BadTensor(f"raw BYTES tensor holds more than the {limit} elements of its shape")
        if at + 4 > len(view):
            raise BadTensor(f"raw BYTES tensor is malformed: {len(view) - at} bytes left where a length goes")
        (n,) = _LEN.unpack_from(view, at)
        at += 4
        if at + n > len(view):
            raise BadTensor(
                f"raw BYTES tensor is malformed: element {len(out)} declares {n} bytes, {len(view) - at} left"
            )
        out.append(bytes(view[at : at + n]))
        at += n
    return out


def _count(shape: Any) -> int:
    total = 1
    for d in shape:
        if d < 0:
            raise BadTensor(f"shape {list(shape)} has a negative dimension")
        total *= d
    return total


def one_tensor(n_tensors: int, io: ModelIO) -> None:
    if n_tensors != 1:
        raise BadTensor(f"request has {n_tensors} input tensors; this model takes one: {io.describe()}")


def check_tensor(
    n_tensors: int, name: str, datatype: str, shape: Sequence[int], io: ModelIO, max_items: int | None
) -> int:
    """The checks both protocols make before they look at a tensor's data: one tensor, this
    model's name and datatype, a shape whose items fit ``max_items``; returns its element count."""
    one_tensor(n_tensors, io)
    if name != INPUT_NAME:
        raise BadTensor(f"input {name!r} is not this model's; it takes {io.describe()}")
    if datatype != io.datatype:
        raise BadTensor(f"input {INPUT_NAME!r} is {datatype or 'untyped'}; this model takes {io.describe()}")
    count = _count(shape)
    if not shape:
        raise BadTensor(f"input {INPUT_NAME!r} has no shape; this model takes {io.describe()}")
    items = count if io.datatype == "BYTES" or not io.features else count // io.features
    if max_items is not None and items > max_items:
        raise BadTensor(
            f"request has {items} inputs, over the limit of {max_items} (--max-items-per-request)"
        )
    if io.datatype == "FP32" and shape[-1] != io.features:
        raise BadTensor(f"input shape {list(shape)}: rows of {io.features} features expected")
    return count


def bytes_items(
    shape: Sequence[int], count: int, raw: bytes | None, elements: Sequence[bytes] = ()
) -> list[pb.Input]:
    """A BYTES tensor's items, from its raw form (length-prefixed elements) or its elements."""
    got = split_bytes(raw, count) if raw is not None else elements
    if len(got) != count:
        raise BadTensor(f"input shape {list(shape)} holds {count} elements, the data {len(got)}")
    return [pb.Input(data=e) for e in got]


def raw_fp32(shape: Sequence[int], count: int, raw: bytes) -> np.ndarray:
    """A raw FP32 tensor (little-endian) as values, once its length matches the shape."""
    if len(raw) != 4 * count:
        raise BadTensor(f"input shape {list(shape)} is {4 * count} bytes of FP32, the data {len(raw)}")
    return np.frombuffer(raw, dtype="<f4")


def feature_items(values: np.ndarray, io: ModelIO) -> list[pb.Input]:
    """An FP32 tensor's rows of ``io.features`` values, one item each."""
    rows = values.reshape(-1, io.features) if io.features else values.reshape(0, 0)
    return [pb.Input(features=row.tolist()) for row in rows]


def to_inputs(request: Any, io: ModelIO, max_items: int | None = None) -> list[pb.Input]:
    """The request's one input tensor as handler items; BadTensor names what does not fit. Counts
    are checked (shape, then data) before any element is copied: a 12 MB message can declare
    millions of empty elements."""
    one_tensor(len(request.inputs), io)
    tensor = request.inputs[0]
    raw = request.raw_input_contents
    if len(raw) > 1:
        raise BadTensor(f"{len(raw)} raw_input_contents for one input tensor")
    if raw and tensor.HasField("contents"):
        raise BadTensor(f"input {INPUT_NAME!r} has both contents and raw_input_contents: send one")
    shape = tensor.shape
    count = check_tensor(1, tensor.name, tensor.datatype, shape, io, max_items)
    data = raw[0] if raw else None  # each access to the repeated field copies the bytes
    if io.datatype == "BYTES":
        n = len(tensor.contents.bytes_contents)
        if data is None and n != count:  # counted before the repeated field becomes a list
            raise BadTensor(f"input shape {list(shape)} holds {count} elements, the data {n}")
        return bytes_items(
            shape, count, data, [] if data is not None else list(tensor.contents.bytes_contents)
        )
    if data is not None:
        values = raw_fp32(shape, count, data)
    else:
        n = len(tensor.contents.fp32_contents)
        if n != count:
            raise BadTensor(f"input shape {list(shape)} holds {count} values, fp32_contents {n}")
        values = np.asarray(tensor.contents.fp32_contents, dtype=np.float32)
    return feature_items(values, io)


OUTPUT_NAMES = ("LABEL", "SCORE", "VALUES")
METADATA_OUTPUTS = (("LABEL", "INT64"), ("SCORE", "FP32"))  # what model metadata advertises, per item


def check_outputs(names: Sequence[str]) -> None:
    """BadTensor for an output name this server does not answer."""
    unknown = [n for n in names if n not in OUTPUT_NAMES]
    if unknown:
        raise BadTensor(f"output {unknown[0]!r} is not this model's; it answers 'LABEL' and 'SCORE'")


def output_tensors(outputs: list[pb.Output], names: Sequence[str] = ()) -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, little-endian array) for LABEL, SCORE (and VALUES when every output carries
    as many values), in the order of ``names`` (all when empty)."""
    n = len(outputs)
    tensors: dict[str, tuple[str, np.ndarray]] = {
        "LABEL": ("INT64", np.fromiter((o.label for o in outputs), dtype="<i8", count=n)),
        "SCORE": ("FP32", np.fromiter((o.score for o in outputs), dtype="<f4", count=n)),
    }
    widths = {len(o.values) for o in outputs}
    if len(widths) == 1 and widths.pop() > 0:
        tensors["VALUES"] = ("FP32", np.asarray([list(o.values) for o in outputs], dtype="<f4"))
    chosen = [name for name in names if name in tensors] or list(tensors)
    return [(name, *tensors[name]) for name in chosen]


def to_response(request: Any, model: str, outputs: list[pb.Output]) -> Any:
    """LABEL, SCORE (and VALUES) as raw little-endian tensors, in the order asked (all by default)."""
    response = oip.ModelInferResponse(model_name=model, model_version=VERSION, id=request.id)
    for name, datatype, values in output_tensors(outputs, [o.name for o in request.outputs]):
        response.outputs.add(name=name, datatype=datatype, shape=list(values.shape))
        response.raw_output_contents.append(values.tobytes())
    return response


class OipServicer:
    """``inference.GRPCInferenceService`` over an InferenceServicer (its queue, readiness, trailers)."""

    def __init__(self, inner: InferenceServicer, io: ModelIO, platform: str = "netgain") -> None:
        self.inner = inner
        self.io = io
        self.platform = platform

    def known(self, name: str, version: str) -> bool:
        return name == self.inner.model and version in ("", VERSION)

    def missing(self, name: str, version: str) -> str:
        if name != self.inner.model:
            return f"model {name!r} is not served here (this server runs {self.inner.model!r})"
        return f"model {name!r} has only version {VERSION!r}, not {version!r}"

    def ready(self) -> bool:
        return self.inner.ready and not self.inner.stopping

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return oip.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return oip.ServerReadyResponse(ready=self.ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return oip.ModelReadyResponse(ready=self.known(request.name, request.version) and self.ready())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        if not self.known(request.name, request.version):
            await context.abort(grpc.StatusCode.NOT_FOUND, self.missing(request.name, request.version))
        meta = oip.ModelMetadataResponse(name=self.inner.model, versions=[VERSION], platform=self.platform)
        meta.inputs.add(name=INPUT_NAME, datatype=self.io.datatype, shape=self.io.input_shape)
        for name, datatype in METADATA_OUTPUTS:
            meta.outputs.add(name=name, datatype=datatype, shape=[-1])
        return meta

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        arrival = self.inner.clock()
        refused: tuple[Any, str] | None = None
        inputs: list[pb.Input] = []
        if request.model_name and not self.known(request.model_name, request.model_version):
            refused = (grpc.StatusCode.NOT_FOUND, self.missing(request.model_name, request.model_version))
        else:
            try:
                check_outputs([o.name for o in request.outputs])
                inputs = to_inputs(request, self.io, self.inner.limits.max_items)
            except BadTensor as exc:
                refused = (grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        p = await self.inner.infer_items(arrival, "", inputs, context, refused, fallback_id=request.id)
        return to_response(request, self.inner.model, p.outputs)
