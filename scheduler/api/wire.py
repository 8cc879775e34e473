"""Service registration whose request decoding answers malformed bytes INVALID_ARGUMENT.

grpcio decodes a request before any servicer code runs, and a protobuf
DecodeError there reaches the caller as UNKNOWN ("Unexpected <class
DecodeError>"). The deserializers registered here return a `MalformedRequest`
instead; the `rpc` decorator (scheduler/api/rpc.py) answers it INVALID_ARGUMENT
naming the message type, before the handler body runs. A message over the gRPC
receive limit never gets this far: gRPC answers it RESOURCE_EXHAUSTED.

Handlers are built from the services' descriptors (every method of the proto,
unary only), as the generated `add_*Servicer_to_server` would build them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError

from shared.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """Stands in for a request whose bytes are not a message of its type."""

    message_type: str  # the full protobuf name, e.g. agentrt.v1.SubmitRunRequest

    def error(self) -> InvalidArgument:
        return InvalidArgument("request", f"is not a valid {self.message_type} message")


def _tolerant_parser(parse: Callable[[bytes], Any], message_type: str) -> Callable[[bytes], Any]:
    malformed = MalformedRequest(message_type)

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return malformed

    return deserialize


def method_handlers(service: ServiceDescriptor, servicer: Any) -> dict[str, grpc.RpcMethodHandler]:
    handlers = {}
    for method in service.methods:
        if method.client_streaming or method.server_streaming:
            raise TypeError(f"{method.full_name}: only unary methods are registered here")
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=_tolerant_parser(request.FromString, method.input_type.full_name),
            response_serializer=response.SerializeToString)
    return handlers


def add_service(server: grpc.aio.Server, service: ServiceDescriptor, servicer: Any) -> None:
    """Registers `servicer` for every method of `service`, as the generated add_*_to_server does."""
    handlers = method_handlers(service, servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
