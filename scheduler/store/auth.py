"""The store's side of authentication and audit: API keys, and the audit trail every operator
path writes in its own transaction (docs/design.md §security).

An audit row is also an outbox event (`agent.audit.<action>`), so the trail reaches Kafka
in the order of the run it concerns; an action on no run (a key) is ordered by the key's id.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from asyncpg import Record

from scheduler.store.core import Repository, db_call, trace_params
from scheduler.store.queries import Q
from scheduler.store.types import AuditEntry
from shared.canonical import sha256_of, uuid7
from shared.db import execute, fetch, fetchrow, fetchval
from shared.errors import AlreadyExists, NotFound
from shared.tracing import NO_TRACE, Trace


@dataclass(frozen=True)
class ApiKeyRow:
    id: uuid.UUID
    name: str
    tenants: tuple[str, ...]
    role: str
    created_by: str
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None

    @classmethod
    def of(cls, row: Record) -> ApiKeyRow:
        return cls(row["id"], row["name"], tuple(row["tenants"]), row["role"], row["created_by"],
                   row["created_at"], row["expires_at"], row["revoked_at"])


@dataclass(frozen=True)
class KeyForAuth:
    id: uuid.UUID
    name: str
    tenants: tuple[str, ...]
    role: str
    secret_hash: bytes
    revoked: bool
    expires_epoch: float | None


def run_state(run: Record | Any | None) -> dict[str, Any] | None:
    """What an audit row records of a run before and after an action."""
    if run is None:
        return None
    return {"status": run["status"], "version": run["version"], "fencing_token": run["fencing_token"],
            "cancel_requested": run["cancel_requested_at"] is not None}


async def write_audit(conn: asyncpg.Connection, entry: AuditEntry, *, tenant_id: str, action: str,
                      run_id: uuid.UUID | None = None, step_key: str | None = None,
                      before: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
                      evidence: dict[str, Any] | None = None, stream_id: uuid.UUID | None = None,
                      trace: Trace = NO_TRACE, run_version: int = 0, fencing_token: int = 0) -> uuid.UUID:
    """The audit row and its outbox event, in the caller's transaction.

    The event carries who, what, why and the statuses, never the evidence itself (its SHA-256
    only): evidence may hold a customer's data, Kafka's readers are wider than the audit's.
    """
    audit_id = uuid7()
    await execute(conn, Q.insert_audit, audit_id=audit_id, principal=entry.principal,
                  principal_kind=entry.principal_kind, tenant_id=tenant_id, action=action, run_id=run_id,
                  step_key=step_key, reason=entry.reason, comment=entry.comment, ticket_id=entry.ticket_id,
                  state_before=before, state_after=after, evidence=evidence, request_id=entry.request_id)
    payload: dict[str, Any] = {
        "audit_id": str(audit_id), "action": action, "principal": entry.principal,
        "principal_kind": entry.principal_kind, "reason": entry.reason, "ticket_id": entry.ticket_id,
        "step_key": step_key, "state_before": before, "state_after": after,
        "evidence_sha256": sha256_of(evidence).hex() if evidence else None,
    }
    await execute(conn, Q.insert_event, event_id=uuid7(), run_id=run_id or stream_id or audit_id,
                  tenant_id=tenant_id, event_type=f"agent.audit.{action}",
                  payload={k: v for k, v in payload.items() if v is not None},
                  fencing_token=fencing_token, run_version=run_version, **trace_params(trace),
                  write_op=None, write_hash=None)
    return audit_id


class AuthStore(Repository):
    @db_call
    async def create_api_key(self, *, key_id: uuid.UUID, name: str, tenants: list[str], role: str,
                             secret_hash: bytes, expires_in_s: int, audit: AuditEntry,
                             trace: Trace = NO_TRACE) -> ApiKeyRow:
        try:
            async with self.db.admin_tx("CreateApiKey") as conn:
                row = await fetchrow(conn, Q.insert_api_key, id=key_id, name=name, tenants=tenants, role=role,
                                     secret_hash=secret_hash, created_by=audit.principal,
                                     expires_in_s=expires_in_s)
                assert row is not None
                key = ApiKeyRow.of(row)
                await write_audit(conn, audit, tenant_id=",".join(tenants), action="key.create", stream_id=key_id,
                                  after=_key_state(key), trace=trace)
        except asyncpg.UniqueViolationError:
            # The key id comes from the request's request_id: its first attempt made the key.
            raise AlreadyExists(f"request_id already made API key {key_id} (its secret was shown once; if it was "
                                "lost, revoke that key and create another); nothing was written",
                                field="request_id", key_id=key_id) from None
        return key

    @db_call
    async def revoke_api_key(self, key_id: uuid.UUID, *, within: tuple[str, ...], audit: AuditEntry,
                             trace: Trace = NO_TRACE) -> ApiKeyRow:
        async with self.db.admin_tx("RevokeApiKey") as conn:
            before = await fetchrow(conn, Q.api_key_by_id, id=key_id, tenants=list(within))
            if before is None:
                raise NotFound(f"API key {key_id} not found", key_id=key_id)
            row = await fetchrow(conn, Q.revoke_api_key, id=key_id, tenants=list(within), revoked_by=audit.principal)
            if row is None:  # revoked already: answer with it, audit nothing (nothing changed)
                return ApiKeyRow.of(before)
            key = ApiKeyRow.of(row)
            await write_audit(conn, audit, tenant_id=",".join(key.tenants), action="key.revoke", stream_id=key_id,
                              before=_key_state(ApiKeyRow.of(before)), after=_key_state(key), trace=trace)
        return key

    @db_call
    async def list_api_keys(self, *, within: tuple[str, ...], include_revoked: bool,
                            after: tuple[dt.datetime, uuid.UUID] | None, limit: int) -> list[ApiKeyRow]:
        async with self.pool.acquire() as conn:
            rows = await fetch(conn, Q.list_api_keys, tenants=list(within), include_revoked=include_revoked,
                               after_created_at=after[0] if after else None, after_id=after[1] if after else None,
                               limit=limit)
        return [ApiKeyRow.of(r) for r in rows]

    @db_call
    async def key_for_auth(self, key_id: uuid.UUID) -> KeyForAuth | None:
        async with self.pool.acquire() as conn:
            row = await fetchrow(conn, Q.api_key_for_auth, id=key_id)
        if row is None:
            return None
        return KeyForAuth(row["id"], row["name"], tuple(row["tenants"]), row["role"], bytes(row["secret_hash"]),
                          row["revoked"], row["expires_epoch"])

    @db_call
    async def database_epoch(self) -> float:
        async with self.pool.acquire() as conn:
            return float(await fetchval(conn, Q.database_epoch))

    @db_call
    async def list_audit(self, *, tenant_id: str | None, run_id: uuid.UUID | None, principal: str | None,
                         action: str | None, since: dt.datetime | None, until: dt.datetime | None,
                         before_id: int | None, limit: int) -> list[Record]:
        async with self.db.admin_tx("ListAudit") as conn:
            return await fetch(conn, Q.list_audit, tenant_id=tenant_id, run_id=run_id, principal=principal,
                               action=action, since=since, until=until, before_id=before_id, limit=limit)


def _key_state(key: ApiKeyRow) -> dict[str, Any]:
    return {"key_id": str(key.id), "name": key.name, "tenants": list(key.tenants), "role": key.role,
            "expires_at": key.expires_at.isoformat() if key.expires_at else None,
            "revoked": key.revoked_at is not None}


__all__ = ["ApiKeyRow", "AuthStore", "KeyForAuth", "run_state", "write_audit"]
