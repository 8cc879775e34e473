"""The store's side of runtime flow limits (migration 0015): set, clear and list rows of
flow_limits, each change audited in its own transaction, and the per-tenant view of
`agentrt status`. Readers of the limits go through Database.flow (cached per replica)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from scheduler.flow_limits import LimitKey, LimitRow
from scheduler.store.auth import write_audit
from scheduler.store.core import Repository, db_call
from scheduler.store.queries import Q
from scheduler.store.types import AuditEntry
from shared.db import fetch, fetchrow
from shared.tracing import NO_TRACE, Trace

_LIMIT_STREAMS = uuid.UUID("5b0e7a52-3c1f-4d2e-9a51-0f1a7c2b6d15")


@dataclass(frozen=True)
class TenantFlow:
    queued: int
    running: int
    waiting_on: dict[str, int]


def _params(key: LimitKey) -> dict[str, str]:
    return {"scope": key.scope, "tenant_id": key.tenant_id, "subject": key.subject, "limit_name": key.name}


def _state(row: Any) -> dict[str, Any] | None:
    return None if row is None else {"scope": row["scope"], "tenant_id": row["tenant_id"],
                                     "subject": row["subject"], "name": row["limit_name"], "value": row["value"]}


def _stream(key: LimitKey) -> uuid.UUID:
    """One event stream per limit, so its changes reach Kafka in order."""
    return uuid.uuid5(_LIMIT_STREAMS, "\x1f".join((key.scope, key.tenant_id, key.subject, key.name)))


class LimitsStore(Repository):
    @db_call
    async def set_limit(self, key: LimitKey, value: str, *, audit: AuditEntry, trace: Trace = NO_TRACE) -> LimitRow:
        # The admin scope: the audit row may be every tenant's ("*"), written with the change.
        async with self.db.admin_tx("SetLimit") as conn:
            before = await fetchrow(conn, Q.lock_flow_limit, **_params(key))
            if before is not None and before["value"] == value:
                return LimitRow.of(before)  # set already (a retry): nothing changes, nothing is audited
            row = await fetchrow(conn, Q.set_flow_limit, **_params(key), value=value, updated_by=audit.principal)
            assert row is not None
            await write_audit(conn, audit, tenant_id=key.tenant_id or "*", action="limit.set", stream_id=_stream(key),
                              before=_state(before), after=_state(row), trace=trace)
        self.db.forget_flow()
        return LimitRow.of(row)

    @db_call
    async def clear_limit(self, key: LimitKey, *, audit: AuditEntry, trace: Trace = NO_TRACE) -> LimitRow | None:
        """The row cleared; None (and nothing audited) when there was none."""
        async with self.db.admin_tx("ClearLimit") as conn:
            row = await fetchrow(conn, Q.clear_flow_limit, **_params(key))
            if row is None:
                return None
            await write_audit(conn, audit, tenant_id=key.tenant_id or "*", action="limit.clear",
                              stream_id=_stream(key), before=_state(row), after=None, trace=trace)
        self.db.forget_flow()
        return LimitRow.of(row)

    @db_call
    async def list_limits(self) -> list[LimitRow]:
        async with self.pool.acquire() as conn:
            return [LimitRow.of(row) for row in await fetch(conn, Q.list_flow_limits)]

    @db_call
    async def tenant_flow(self, tenant_id: str) -> TenantFlow:
        async with self.db.tenant_tx(tenant_id, readonly=True) as conn:
            row = await fetchrow(conn, Q.tenant_flow, tenant_id=tenant_id)
        assert row is not None
        return TenantFlow(row["queued"], row["running"], {k: int(n) for k, n in row["waiting_on"].items()})


__all__ = ["LimitsStore", "TenantFlow"]
