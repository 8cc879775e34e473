"""scheduler/api/wire.py: every method registered, and bytes that are no message decoded to a MalformedRequest."""

import pytest

from scheduler.api.service import RunServicer, WorkServicer
from scheduler.api.wire import MalformedRequest, method_handlers
from scheduler.server import RUN_SERVICE, WORK_SERVICE
from shared.gen.agentrt.v1 import run_service_pb2 as rs

CORRUPT = b"\x0a\xff\xff\xff\xff\x0f"  # field 1 claims a length far past the end of the message


@pytest.mark.parametrize(("service", "servicer"), [(RUN_SERVICE, RunServicer), (WORK_SERVICE, WorkServicer)])
def test_every_method_of_the_proto_is_registered_and_decodes_leniently(service, servicer):
    handlers = method_handlers(service, servicer)
    assert set(handlers) == {method.name for method in service.methods}
    for method in service.methods:
        handler = handlers[method.name]
        assert handler.unary_unary is getattr(servicer, method.name)
        malformed = handler.request_deserializer(CORRUPT)
        assert malformed == MalformedRequest(method.input_type.full_name)
        assert type(handler.request_deserializer(b"")).DESCRIPTOR is method.input_type


def test_a_well_formed_request_decodes_as_usual():
    handler = method_handlers(RUN_SERVICE, RunServicer)["SubmitRun"]
    request = rs.SubmitRunRequest(agent_name="demo", input_json='{"a": 1}')
    assert handler.request_deserializer(request.SerializeToString()) == request


def test_malformed_request_names_the_message_type():
    error = MalformedRequest("agentrt.v1.SubmitRunRequest").error()
    assert (error.field, error.message) == (
        "request", "request: is not a valid agentrt.v1.SubmitRunRequest message")
