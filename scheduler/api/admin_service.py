"""RunService's admin side: API keys and the audit trail (docs/design.md §security), and the
audit note every operator RPC turns into an audit row.

An admin acts within the tenants of its own credential: it creates keys for
those tenants only (a key for every tenant, `*`, needs a `*` credential),
lists and revokes only keys wholly inside them, and reads the audit trail of
the call's tenant (`x-tenant-id` picks one when it has several).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from collections.abc import Callable
from typing import Any

import grpc

from scheduler.api import convert
from scheduler.api import validate as v
from scheduler.api.auth import ANY_TENANT, KeyCache, Principal, new_api_key
from scheduler.api.rpc import principal, rpc
from scheduler.flow_limits import LimitKey, LimitRow, check_key, check_value
from scheduler.security.rbac import ROLE_ORDER
from scheduler.store import ApiKeyRow, AuditEntry, Store
from shared.canonical import canonical_json, uuid7
from shared.errors import InvalidArgument, TenantForbidden
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.tracing import current_trace

REQUEST_ID_HEADER = "x-request-id"
ROLE_OF = {rs.API_KEY_ROLE_VIEWER: "viewer", rs.API_KEY_ROLE_SUBMITTER: "submitter",
           rs.API_KEY_ROLE_OPERATOR: "operator", rs.API_KEY_ROLE_ADMIN: "admin"}
ROLE_NUMBER = {name: number for number, name in ROLE_OF.items()}
assert tuple(ROLE_OF.values()) == ROLE_ORDER


def request_id_of(context: grpc.aio.ServicerContext, given: str | None = None) -> str:
    """The id an audit row records: the request's own request_id, else the call's x-request-id
    metadata, else a new one."""
    if given:
        return given
    value = next((val for key, val in (context.invocation_metadata() or ()) if key == REQUEST_ID_HEADER), None)
    if isinstance(value, str) and value:
        return v.require_text(REQUEST_ID_HEADER, value, max_len=200)
    return str(uuid7())


# Never change: a retried CreateApiKey must name the key its first attempt made.
_KEY_REQUESTS = uuid.UUID("9a4e2f17-6c3b-5d80-8e15-2b7f0c9d4a61")


def _request_id(request: Any) -> str | None:
    return v.optional_text("request_id", request.request_id, max_len=200)


def audit_entry(context: grpc.aio.ServicerContext, note: rs.AuditNote, *, reason: str | None = None,
                comment: str | None = None, request_id: str | None = None) -> AuditEntry:
    """Who acts (the admitted principal, never the request) and why (the request's note)."""
    note_reason = v.optional_text("note.reason", note.reason, max_len=1000)
    note_comment = v.optional_text("note.comment", note.comment, max_len=2000)
    ticket = v.optional_text("note.ticket_id", note.ticket_id, max_len=200)
    joined = " | ".join(part for part in (comment, note_comment) if part) or None
    return principal().audit(reason=note_reason or reason, comment=joined, ticket_id=ticket,
                             request_id=request_id_of(context, request_id))


def key_to_proto(key: ApiKeyRow) -> rs.ApiKey:
    message = rs.ApiKey(key_id=str(key.id), name=key.name, tenants=list(key.tenants), role=ROLE_NUMBER[key.role],
                        created_by=key.created_by)
    convert.set_time(message, "created_at", key.created_at)
    convert.set_time(message, "expires_at", key.expires_at)
    convert.set_time(message, "revoked_at", key.revoked_at)
    return message


def _json(value: Any) -> str:
    return canonical_json(value) if value is not None else ""


def audit_to_proto(row: Any) -> rs.AuditEvent:
    event = rs.AuditEvent(
        audit_id=str(row["audit_id"]), principal=row["principal"], principal_kind=row["principal_kind"],
        tenant_id=row["tenant_id"], action=row["action"], run_id=str(row["run_id"] or ""),
        step_key=row["step_key"] or "", reason=row["reason"] or "", comment=row["comment"] or "",
        ticket_id=row["ticket_id"] or "", state_before_json=_json(row["state_before"]),
        state_after_json=_json(row["state_after"]), evidence_json=_json(row["evidence"]),
        request_id=row["request_id"] or "")
    convert.set_time(event, "at", row["at"])
    return event


def _token(payload: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


def _untoken(token: str, filter_key: str) -> dict[str, Any]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        if not isinstance(data, dict):
            raise ValueError("token")
        same = data.get("f") == filter_key
    except (ValueError, TypeError):
        raise InvalidArgument("page_token", "is not a token this server issued") from None
    if not same:
        raise InvalidArgument("page_token", "was issued for a different filter")
    return data


def _page_size(value: int) -> int:
    return value or 50  # its range: scheduler/bounds.py


def time_field(message: Any, field: str) -> dt.datetime | None:
    if not message.HasField(field):
        return None
    try:
        return getattr(message, field).ToDatetime(tzinfo=dt.UTC)  # type: ignore[no-any-return]
    except ValueError:
        raise InvalidArgument(field, "is not a valid timestamp") from None


def limit_to_proto(row: LimitRow) -> rs.FlowLimit:
    message = rs.FlowLimit(scope=row.key.scope, tenant_id=row.key.tenant_id, subject=row.key.subject,
                           name=row.key.name, value=row.value, updated_by=row.updated_by)
    convert.set_time(message, "updated_at", row.updated_at)
    return message


def _limit_key(request: rs.SetLimitRequest | rs.ClearLimitRequest, call_tenant: Callable[[], str]) -> LimitKey:
    """The limit a SetLimit / ClearLimit names. Limits keep tenants from one another, so changing any of
    them (even one tenant's) takes a credential for every tenant ('*')."""
    tenant = request.tenant_id
    if request.scope == "tenant" and not tenant:
        tenant = call_tenant()
    key = check_key(request.scope, tenant, request.subject, request.name)
    if ANY_TENANT not in principal().tenants:
        raise TenantForbidden("changing flow limits needs a credential for every tenant ('*')",
                              tenant=key.tenant_id or ANY_TENANT)
    return key


def _managed_tenants(caller: Principal) -> tuple[str, ...]:
    return (ANY_TENANT,) if ANY_TENANT in caller.tenants else caller.tenants


class AdminRpcs:
    """Mixed into RunServicer: needs `store`, `keys` and `_tenant`."""

    store: Store
    keys: KeyCache | None

    def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        raise NotImplementedError

    @rpc
    async def ListAuditEvents(self, request: rs.ListAuditEventsRequest,
                              context: grpc.aio.ServicerContext) -> rs.ListAuditEventsResponse:
        caller = principal()
        # An admin of every tenant without x-tenant-id reads the whole trail ('*' key rows included).
        # (auth_mode none's anonymous caller names its tenant, as for every other call).
        every = caller.kind != "anonymous" and ANY_TENANT in caller.tenants \
            and not v.tenant_values(context.invocation_metadata())
        tenant = None if every else self._tenant(context)
        run_id = v.optional_uuid("run_id", request.run_id)
        who = v.optional_text("principal", request.principal, max_len=400)
        action = v.optional_text("action", request.action, max_len=100)
        since, until = time_field(request, "since"), time_field(request, "until")
        size = _page_size(request.page_size)
        filter_key = json.dumps([tenant or ANY_TENANT, str(run_id), who, action, str(since), str(until)])
        before = _untoken(request.page_token, filter_key).get("b") if request.page_token else None
        if before is not None and (not isinstance(before, int) or isinstance(before, bool)):
            raise InvalidArgument("page_token", "is not a token this server issued")
        rows = await self.store.auth.list_audit(tenant_id=tenant, run_id=run_id, principal=who, action=action,
                                                since=since, until=until, before_id=before, limit=size + 1)
        token = ""
        if len(rows) > size:
            rows = rows[:size]
            token = _token({"b": rows[-1]["id"], "f": filter_key})
        return rs.ListAuditEventsResponse(events=[audit_to_proto(r) for r in rows], next_page_token=token)

    @rpc
    async def CreateApiKey(self, request: rs.CreateApiKeyRequest,
                           context: grpc.aio.ServicerContext) -> rs.CreateApiKeyResponse:
        caller = principal()
        name = v.require_text("name", request.name, max_len=200)
        role = v.require_enum("role", request.role, ROLE_OF)
        tenants = sorted(set(request.tenants)) or [self._tenant(context)]
        for tenant in tenants:
            if tenant != ANY_TENANT:
                v.require_tenant("tenants", tenant)
            if not caller.allows_tenant(tenant) or (tenant == ANY_TENANT and ANY_TENANT not in caller.tenants):
                raise TenantForbidden(f"this credential may not create keys for tenant {tenant!r}", tenant=tenant)
        if role != "admin" and (len(tenants) > 1 or tenants == [ANY_TENANT]):
            raise InvalidArgument("tenants", "only an admin key may hold several tenants or '*'")
        request_id = _request_id(request)
        audit = audit_entry(context, request.note, request_id=request_id)
        # With a request id, the key a retry would make is the one its first attempt made: found, it is
        # ALREADY_EXISTS. The text shown names that id (it named a random one, which no lookup finds).
        key_id, secret, digest = new_api_key(
            uuid.uuid5(_KEY_REQUESTS, f"{caller.id}\x1f{request_id}") if request_id is not None else None)
        key = await self.store.auth.create_api_key(key_id=key_id, name=name, tenants=tenants, role=role,
                                                   secret_hash=digest, expires_in_s=request.expires_in_s, audit=audit,
                                                   trace=current_trace())
        return rs.CreateApiKeyResponse(key=key_to_proto(key), secret=secret)

    @rpc
    async def ListApiKeys(self, request: rs.ListApiKeysRequest,
                          context: grpc.aio.ServicerContext) -> rs.ListApiKeysResponse:
        within = _managed_tenants(principal())
        size = _page_size(request.page_size)
        filter_key = json.dumps([list(within), request.include_revoked])
        after = None
        if request.page_token:
            data = _untoken(request.page_token, filter_key)
            try:
                after = (dt.datetime.fromisoformat(data["c"]), uuid.UUID(data["i"]))
            except (KeyError, TypeError, ValueError):
                raise InvalidArgument("page_token", "is not a token this server issued") from None
        rows = await self.store.auth.list_api_keys(within=within, include_revoked=request.include_revoked, after=after,
                                                   limit=size + 1)
        token = ""
        if len(rows) > size:
            rows = rows[:size]
            token = _token({"c": rows[-1].created_at.isoformat(), "i": str(rows[-1].id), "f": filter_key})
        return rs.ListApiKeysResponse(keys=[key_to_proto(r) for r in rows], next_page_token=token)

    @rpc
    async def RevokeApiKey(self, request: rs.RevokeApiKeyRequest, context: grpc.aio.ServicerContext) -> rs.ApiKey:
        key_id = v.require_uuid("key_id", request.key_id)
        audit = audit_entry(context, request.note, request_id=_request_id(request))
        key = await self.store.auth.revoke_api_key(key_id, within=_managed_tenants(principal()), audit=audit,
                                                   trace=current_trace())
        if self.keys is not None:
            self.keys.forget(key_id)  # this replica at once; the others within api_key_cache_ttl_ms
        return key_to_proto(key)

    @rpc
    async def SetLimit(self, request: rs.SetLimitRequest, context: grpc.aio.ServicerContext) -> rs.FlowLimit:
        key = _limit_key(request, lambda: self._tenant(context))
        value = check_value(key, request.value)
        audit = audit_entry(context, request.note, request_id=_request_id(request))
        row = await self.store.limits.set_limit(key, value, audit=audit, trace=current_trace())
        return limit_to_proto(row)

    @rpc
    async def ClearLimit(self, request: rs.ClearLimitRequest,
                         context: grpc.aio.ServicerContext) -> rs.ClearLimitResponse:
        key = _limit_key(request, lambda: self._tenant(context))
        audit = audit_entry(context, request.note, request_id=_request_id(request))
        row = await self.store.limits.clear_limit(key, audit=audit, trace=current_trace())
        if row is None:
            return rs.ClearLimitResponse(cleared=False)
        return rs.ClearLimitResponse(cleared=True, limit=limit_to_proto(row))

    @rpc
    async def ListLimits(self, request: rs.ListLimitsRequest,
                         context: grpc.aio.ServicerContext) -> rs.ListLimitsResponse:
        """Deployment-wide limits and those of the call's tenant; an every-tenant admin without
        x-tenant-id sees every tenant's (as ListAuditEvents)."""
        caller = principal()
        every = caller.kind != "anonymous" and ANY_TENANT in caller.tenants \
            and not v.tenant_values(context.invocation_metadata())
        tenant = None if every else self._tenant(context)
        rows = [row for row in await self.store.limits.list_limits()
                if tenant is None or row.key.deployment_wide or row.key.tenant_id == tenant]
        return rs.ListLimitsResponse(limits=[limit_to_proto(r) for r in rows])
