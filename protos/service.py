"""Service glue built from the descriptors instead of grpcio-tools' ``_pb2_grpc``.

Generated ``_pb2_grpc`` modules refuse to import under a grpcio older than the
grpcio-tools that made them; building handlers and stubs from the service
descriptor keeps the committed ``*_pb2.py`` importable under any grpcio.

Two services: ``netgain.v1.Inference`` (inference.proto) and the Open Inference Protocol's
``inference.GRPCInferenceService`` (oip.proto, KServe v2), whose messages live in a private
descriptor pool (see generate.py).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import message_factory

from netgain.protos import inference_pb2, oip_pb2

SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
SERVICE_NAME = SERVICE.full_name  # "netgain.v1.Inference"
OIP_SERVICE = oip_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
OIP_SERVICE_NAME = OIP_SERVICE.full_name  # "inference.GRPCInferenceService"


def _message_class(descriptor: Any) -> Any:
    return message_factory.GetMessageClass(descriptor)


def _add_servicer(service: Any, servicer: Any, server: Any) -> None:
    handlers = {}
    for method in service.methods:
        req_cls = _message_class(method.input_type)
        resp_cls = _message_class(method.output_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=req_cls.FromString,
            response_serializer=resp_cls.SerializeToString,
        )
    generic = grpc.method_handlers_generic_handler(service.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))


def _bind_stub(stub: Any, service: Any, channel: Any) -> None:
    for method in service.methods:
        req_cls = _message_class(method.input_type)
        resp_cls = _message_class(method.output_type)
        callable_ = channel.unary_unary(
            f"/{service.full_name}/{method.name}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        setattr(stub, method.name, callable_)


def add_inference_servicer(servicer: Any, server: Any) -> None:
    """Register ``servicer`` (an object with one method per RPC) on a grpc or grpc.aio server."""
    _add_servicer(SERVICE, servicer, server)


def add_oip_servicer(servicer: Any, server: Any) -> None:
    """Register an Open Inference Protocol servicer (ServerLive, ServerReady, ModelReady,
    ModelMetadata, ModelInfer) on a grpc or grpc.aio server."""
    _add_servicer(OIP_SERVICE, servicer, server)


class InferenceStub:
    """Client stub: ``stub.Infer(request, metadata=..., timeout=...)`` on a grpc or grpc.aio channel."""

    Infer: Any
    ServerInfo: Any
    Profile: Any

    def __init__(self, channel: Any) -> None:
        _bind_stub(self, SERVICE, channel)


class OipStub:
    """Open Inference Protocol client stub (``stub.ModelInfer(request, metadata=..., timeout=...)``)."""

    ServerLive: Any
    ServerReady: Any
    ModelReady: Any
    ModelMetadata: Any
    ModelInfer: Any

    def __init__(self, channel: Any) -> None:
        _bind_stub(self, OIP_SERVICE, channel)
