"""gRPC server reflection under `grpc.reflection.v1` as well as the deprecated `v1alpha`.

grpcio-reflection ships only v1alpha. The two protocols are the same messages
under another package name (field for field, so the same bytes on the wire):
current clients (grpcurl, grpcui, Postman, buf curl) ask v1 first, older ones
v1alpha. One servicer answers both; v1 is registered as a generic handler with
the v1alpha message classes for its (identical) wire format.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"


def enable_reflection(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Answers reflection for `service_names` (and for both reflection services) on `server`."""
    names = (*service_names, reflection.SERVICE_NAME, V1_SERVICE_NAME)
    servicer = reflection.ReflectionServicer(names)
    v1alpha = grpc.method_handlers_generic_handler(reflection.SERVICE_NAME, _handlers(servicer))
    v1 = grpc.method_handlers_generic_handler(V1_SERVICE_NAME, _handlers(servicer))
    server.add_generic_rpc_handlers((v1alpha, v1))


def _handlers(servicer: reflection.ReflectionServicer) -> dict[str, grpc.RpcMethodHandler]:
    return {"ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)}
