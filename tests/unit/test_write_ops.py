"""The WriteBatch op map read from the proto names every fenced write, and results answer under the same field."""

from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.writes import WRITE_OPS


def test_every_fenced_write_is_a_batch_op_answered_under_its_own_field():
    methods = {m.name for m in ws.DESCRIPTOR.services_by_name["WorkService"].methods}
    # SpawnChildren is fenced but never batched: it is the one write of its step (the spawn is
    # saved in the checkpoint before it, the wait in FinishRun after it).
    assert set(WRITE_OPS.values()) == methods - {"ClaimWork", "WriteBatch", "ReadJournal", "GetToolResults",
                                                 "RegisterAgents", "SpawnChildren"}
    results = {f.name for f in ws.WriteBatchResult.DESCRIPTOR.oneofs_by_name["result"].fields}
    assert results == set(WRITE_OPS) | {"error"}
    for op, method in WRITE_OPS.items():
        item = ws.WriteBatchItem.DESCRIPTOR.fields_by_name[op]
        result = ws.WriteBatchResult.DESCRIPTOR.fields_by_name[op]
        assert (item.message_type.name, result.message_type.name) == (f"{method}Request", f"{method}Response")
