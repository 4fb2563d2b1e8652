"""Service glue built from the descriptor instead of grpcio-tools' ``_pb2_grpc``.

Generated ``_pb2_grpc`` modules refuse to import under a grpcio older than the
grpcio-tools that made them; building handlers and stubs from the service
descriptor keeps one committed ``inference_pb2.py`` importable under any grpcio.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import symbol_database

from netgain.protos import inference_pb2

SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
SERVICE_NAME = SERVICE.full_name  # "netgain.v1.Inference"

_db = symbol_database.Default()


def _message_class(descriptor: Any) -> Any:
    return _db.GetSymbol(descriptor.full_name)


def add_inference_servicer(servicer: Any, server: Any) -> None:
    """Register ``servicer`` (an object with one method per RPC) on a grpc or grpc.aio server."""
    handlers = {}
    for method in SERVICE.methods:
        req_cls = _message_class(method.input_type)
        resp_cls = _message_class(method.output_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=req_cls.FromString,
            response_serializer=resp_cls.SerializeToString,
        )
    generic = grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
    server.add_generic_rpc_handlers((generic,))


class InferenceStub:
    """Client stub: ``stub.Infer(request, metadata=..., timeout=...)`` on a grpc or grpc.aio channel."""

    Infer: Any
    ServerInfo: Any
    Profile: Any

    def __init__(self, channel: Any) -> None:
        for method in SERVICE.methods:
            req_cls = _message_class(method.input_type)
            resp_cls = _message_class(method.output_type)
            callable_ = channel.unary_unary(
                f"/{SERVICE_NAME}/{method.name}",
                request_serializer=req_cls.SerializeToString,
                response_deserializer=resp_cls.FromString,
            )
            setattr(self, method.name, callable_)
