"""The trio with row-level security in force (migration 0016): the scheduler connected as the
scheduler role, the relay as the relay role (its sessions in the work scope), a real
Kafka-protocol broker. Runs of two tenants go from submit to COMPLETED and every outbox row of
both reaches Kafka; neither service connects as the owner or a role that skips the policies."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest
from relay_support import TopicReader, pending_count, relay_settings, running_relay, wait_until
from support import claim, eid, lease_ref, scheduler_stack, submit

from scheduler.store.database_roles import DatabaseRoleSettings, apply_roles
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = [pytest.mark.integration, pytest.mark.kafka]
PREFIX = "agentrt_t_"  # tests/integration/scheduler/test_db_roles.py's roles
SETTINGS = DatabaseRoleSettings(role_prefix=PREFIX)


def as_role(db_url: str, service: str) -> str:
    parts = urlsplit(db_url)
    return urlunsplit(parts._replace(netloc=f"{SETTINGS.role_name(service)}@{parts.netloc.rsplit('@', 1)[-1]}"))


async def test_scheduler_and_relay_as_their_roles_with_rls_forced(db_url, db, kafka_bootstrap):
    await apply_roles(db, SETTINGS)
    assert await db.fetchval("SELECT relforcerowsecurity FROM pg_class WHERE relname = 'outbox'")
    async with scheduler_stack(as_role(db_url, "scheduler"), require_row_security=True) as stack:
        runs = [await submit(stack, tenant=tenant) for tenant in ("tenant-a", "tenant-b")]
        for _ in runs:
            lease = await claim(stack)
            assert lease is not None
            ref = lease_ref(lease)
            saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
                lease=ref, expected_version=0, state_json='{"cursor": 1}', schema_version=1, step_key="s1",
                event_id=eid()))
            await stack.work.FinishRun(ws.FinishRunRequest(
                lease=ref, expected_version=saved.version, outcome=ws.FINISH_OUTCOME_COMPLETED,
                result_json='{"ok": true}', event_id=eid()))
        for run, tenant in zip(runs, ("tenant-a", "tenant-b"), strict=True):
            got = await stack.runs.GetRun(rs.GetRunRequest(run_id=run.run_id), metadata=stack.md(tenant))
            assert got.status == pb.RUN_STATUS_COMPLETED
    rows = {r["event_id"]: r for r in await db.fetch("SELECT event_id, tenant_id FROM outbox")}
    assert {r["tenant_id"] for r in rows.values()} == {"tenant-a", "tenant-b"}

    settings = relay_settings(as_role(db_url, "relay"), kafka_bootstrap, batch_size=64)
    reader = await TopicReader(kafka_bootstrap, [settings.topic]).start()
    try:
        async with running_relay(settings) as relay:
            assert await relay.store.pool.fetchval("SELECT current_user") == f"{PREFIX}relay"
            await wait_until(lambda: _none_pending(db), 30, "every row marked published")
            await reader.read_until(lambda got: {r.event.id for r in got} >= set(rows), 30, "every event in Kafka")
    finally:
        await reader.stop()
    assert {r.event.tenant_id for r in reader.records} == {"tenant-a", "tenant-b"}


async def _none_pending(db) -> bool:
    return await pending_count(db) == 0
