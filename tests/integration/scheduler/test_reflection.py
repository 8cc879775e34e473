"""Server reflection answers under grpc.reflection.v1 (what grpcurl, grpcui, Postman and buf curl ask
first) and under the deprecated v1alpha, listing every service and serving their descriptors."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2
from support import scheduler_stack

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("package", ["grpc.reflection.v1", "grpc.reflection.v1alpha"])
async def test_reflection_lists_the_services_and_serves_their_files(db_url, package):
    async with scheduler_stack(db_url) as stack:
        # The two protocols are the same messages under two package names (the same bytes on the wire).
        call = stack.channel.stream_stream(
            f"/{package}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="agentrt.v1.RunService"),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="agentrt.v1.NoSuchThing")]
        replies = [reply async for reply in call(iter(requests), timeout=10)]
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"agentrt.v1.RunService", "agentrt.v1.WorkService", "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= names
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
             for raw in replies[1].file_descriptor_response.file_descriptor_proto]
    services = {f"{f.package}.{s.name}" for f in files for s in f.service}
    assert "agentrt.v1.RunService" in services
    assert replies[2].error_response.error_code == 5  # NOT_FOUND for an unknown symbol
