"""The fenced writes a WriteBatch item can carry, read from the proto itself.

WriteBatchItem's `op` oneof field (e.g. `save_checkpoint`) → the single
WorkService call it stands for (`SaveCheckpoint`); WriteBatchResult answers
under the same field name. Scheduler, executor and tests share this one map.
"""

from __future__ import annotations

from shared.gen.agentrt.v1 import work_service_pb2 as ws

WRITE_OPS: dict[str, str] = {
    field.name: field.message_type.name.removesuffix("Request")  # type: ignore[union-attr]  # message fields
    for field in ws.WriteBatchItem.DESCRIPTOR.oneofs_by_name["op"].fields
}

MAX_BATCH_ITEMS = 256  # writes per WriteBatch call, enforced by the scheduler
# Journal entries one checkpoint-writing call may append, enforced by the scheduler. A step appends a
# few; the first write after a schema-1 checkpoint appends that run's whole inline history at once
# (it must commit with the checkpoint that drops it), so the bound is generous; the gRPC message
# size bounds the bytes.
MAX_JOURNAL_ENTRIES = 20_000
