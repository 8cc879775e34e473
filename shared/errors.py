"""Typed errors and the one table that maps them to gRPC status codes.

Errors carry data (field, reason, metadata), not only text. The scheduler
raises them; the gRPC layer turns them into a status with a google.rpc.ErrorInfo
detail; clients turn a status back into the same class with `from_rpc_error`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

ERROR_DOMAIN = "agentrt.dev"


class AgentrtError(Exception):
    """Base class. `reason` is the stable machine-readable ErrorInfo reason."""

    reason: ClassVar[str] = "INTERNAL"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, **metadata: Any) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = {k: str(v) for k, v in metadata.items() if v is not None}


class InvalidArgument(AgentrtError):
    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}", field=field)
        self.field = field


class Unauthenticated(AgentrtError):
    reason = "TENANT_REQUIRED"


class ExecutorTokenRequired(Unauthenticated):
    """A WorkService call without the executor token the scheduler was given."""

    reason = "EXECUTOR_TOKEN_REQUIRED"


class CredentialRequired(Unauthenticated):
    """A RunService call without a credential, while the scheduler's auth_mode requires one."""

    reason = "CREDENTIAL_REQUIRED"


class CredentialInvalid(Unauthenticated):
    """A credential that does not verify: unknown or revoked key, bad signature, wrong issuer,
    audience or algorithm, unknown key id, malformed token. `problem` says which (metadata)."""

    reason = "CREDENTIAL_INVALID"


class CredentialExpired(Unauthenticated):
    reason = "CREDENTIAL_EXPIRED"


class PermissionDenied(AgentrtError):
    """An authenticated caller whose role does not grant the call's verb."""

    reason = "ROLE_FORBIDS"


class TenantForbidden(PermissionDenied):
    """An `x-tenant-id` the caller's credential is not allowed to act for."""

    reason = "TENANT_NOT_ALLOWED"


class NotFound(AgentrtError):
    reason = "NOT_FOUND"


class AlreadyExists(AgentrtError):
    reason = "ALREADY_EXISTS"


class LeaseLost(AgentrtError):
    """Stale fence, other owner, or a lease that lapsed by database time."""

    reason = "LEASE_LOST"


class VersionConflict(AgentrtError):
    reason = "VERSION_CONFLICT"


class InvalidTransition(AgentrtError):
    reason = "INVALID_TRANSITION"


class RunCancelled(AgentrtError):
    """The run was cancelled; the holder's write ended it. Stop working on it."""

    reason = "RUN_CANCELLED"


class RunEnded(AgentrtError):
    """The run is COMPLETED, FAILED or CANCELLED: nothing may be sent to it any more (SignalRun)."""

    reason = "RUN_ENDED"


class DecisionNotCheckpointed(AgentrtError):
    """Tx1 without the same tool decision in the current checkpoint."""

    reason = "DECISION_NOT_CHECKPOINTED"


class RunFrozen(AgentrtError):
    """Commit-unknown recovery found half a write: the run was frozen, not guessed."""

    reason = "COMMIT_STATE_INCONSISTENT"


class SpawnLimitExceeded(AgentrtError):
    """SpawnChildren past a tree bound (metadata `limit`: max_spawn_depth or max_descendants_per_root,
    `max`, `root_run_id`); nothing written. Not retryable: the tree only grows."""

    reason = "SPAWN_LIMIT_EXCEEDED"


class AgentNotRegistered(AgentrtError):
    """SubmitRun for an agent (or version) that no live executor has registered."""

    reason = "AGENT_NOT_REGISTERED"
    # The way out, in the API's words (the request field); the CLI swaps in its flag (CLI_HINT).
    API_HINT = "or set allow_unregistered in the SubmitRunRequest to queue the run"
    CLI_HINT = "or submit with --allow-unregistered to queue the run"


class SchemaMismatch(AgentrtError):
    reason = "SCHEMA_MISMATCH"


class EncryptionKeyMissing(AgentrtError):
    """Sensitive values cannot be sealed or opened: no keyring, or it lacks the KEK a data key names."""

    reason = "ENCRYPTION_KEY_MISSING"


class SealedValueInvalid(AgentrtError):
    """A sealed value that does not open under the data key of the run (or schedule) that holds it: copied
    from another run, or altered at rest. Names the field, never a value."""

    reason = "SEALED_VALUE_INVALID"

    def __init__(self, field: str, owner: str) -> None:
        super().__init__(f"{field}: a sealed value does not open under the data key of {owner} "
                         "(integrity check failed: copied from another run or altered at rest)", field=field)
        self.field = field


class Unavailable(AgentrtError):
    reason = "UNAVAILABLE"
    retryable = True


class ResourceExhausted(AgentrtError):
    """A limit is full: try again after `retry_after_s` (sent as google.rpc.RetryInfo)."""

    reason = "RESOURCE_EXHAUSTED"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float, **metadata: Any) -> None:
        # The delay rides in the metadata too: a WriteBatch item's error carries no RetryInfo.
        super().__init__(message, retry_after_ms=max(1, round(retry_after_s * 1000)), **metadata)
        self.retry_after_s = max(0.0, retry_after_s)


class QuotaExceeded(ResourceExhausted):
    """SubmitRun over a tenant quota (metadata `limit`: max_queued_runs or max_submits_per_s); nothing written."""

    reason = "QUOTA_EXCEEDED"


class ToolRateLimited(ResourceExhausted):
    """Tx1 of a tool over its rate or concurrency limit (metadata `limit`, `tool`); nothing written.
    The executor waits the RetryInfo delay and sends it again: no attempt, no budget step spent."""

    reason = "TOOL_RATE_LIMITED"


# The one mapping from error class to gRPC status code.
STATUS_CODES: dict[type[AgentrtError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    ExecutorTokenRequired: grpc.StatusCode.UNAUTHENTICATED,
    CredentialRequired: grpc.StatusCode.UNAUTHENTICATED,
    CredentialInvalid: grpc.StatusCode.UNAUTHENTICATED,
    CredentialExpired: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    TenantForbidden: grpc.StatusCode.PERMISSION_DENIED,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    LeaseLost: grpc.StatusCode.FAILED_PRECONDITION,
    VersionConflict: grpc.StatusCode.ABORTED,
    InvalidTransition: grpc.StatusCode.FAILED_PRECONDITION,
    RunCancelled: grpc.StatusCode.FAILED_PRECONDITION,
    RunEnded: grpc.StatusCode.FAILED_PRECONDITION,
    DecisionNotCheckpointed: grpc.StatusCode.FAILED_PRECONDITION,
    RunFrozen: grpc.StatusCode.FAILED_PRECONDITION,
    SchemaMismatch: grpc.StatusCode.FAILED_PRECONDITION,
    EncryptionKeyMissing: grpc.StatusCode.FAILED_PRECONDITION,
    SealedValueInvalid: grpc.StatusCode.DATA_LOSS,
    AgentNotRegistered: grpc.StatusCode.FAILED_PRECONDITION,
    SpawnLimitExceeded: grpc.StatusCode.FAILED_PRECONDITION,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ToolRateLimited: grpc.StatusCode.RESOURCE_EXHAUSTED,
    AgentrtError: grpc.StatusCode.INTERNAL,
}

_BY_REASON: dict[str, type[AgentrtError]] = {cls.reason: cls for cls in STATUS_CODES}


def status_code_for(error: AgentrtError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]  # type: ignore[index]
    return grpc.StatusCode.INTERNAL


def to_grpc_status(error: AgentrtError) -> grpc.Status:
    code = status_code_for(error)
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    details = [detail]
    if isinstance(error, ResourceExhausted):
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromMilliseconds(max(1, round(error.retry_after_s * 1000)))
        later = any_pb2.Any()
        later.Pack(retry)
        details.append(later)
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=error.message, details=details)
    return rpc_status.to_status(status)


def retry_delay_s(error: grpc.RpcError) -> float | None:
    """The google.rpc.RetryInfo delay of a failed call, in seconds, if it carries one."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            return float(retry.retry_delay.ToMilliseconds()) / 1000
    return None


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo detail of a failed call, if it carries one."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def _typed(reason: str, message: str, metadata: Any, retry_after_s: float | None = None) -> AgentrtError | None:
    cls = _BY_REASON.get(reason)
    if cls is None:
        return None
    if issubclass(cls, ResourceExhausted):
        details = dict(metadata)
        carried = details.pop("retry_after_ms", "")
        if retry_after_s is None and carried.isdigit():
            retry_after_s = int(carried) / 1000
        exhausted = cls.__new__(cls)
        ResourceExhausted.__init__(exhausted, message or reason, retry_after_s=retry_after_s or 0.0, **details)
        return exhausted
    if cls is InvalidArgument:
        # The server's message names the field already ("run_id: is not a UUID"): keep the problem only.
        field = metadata.get("field", "?")
        return InvalidArgument(field, (message or "").removeprefix(f"{field}: "))
    exc = cls.__new__(cls)
    AgentrtError.__init__(exc, message or reason, **dict(metadata))
    return exc


def from_batch_error(error: Any) -> AgentrtError:
    """Turn a WriteBatchError (one item's answer) into the typed error its single call would raise."""
    typed = _typed(error.reason, error.message, error.metadata)
    if typed is not None:
        return typed
    return AgentrtError(error.message or f"status {error.code}")


def from_rpc_error(error: grpc.RpcError) -> AgentrtError:
    """Turn a failed call back into the typed error the server raised."""
    info = error_info(error)
    message = error.details() if hasattr(error, "details") else str(error)  # type: ignore[union-attr]
    if info is not None:
        typed = _typed(info.reason, message, info.metadata, retry_delay_s(error))
        if typed is not None:
            return typed
    code = error.code() if hasattr(error, "code") else None  # type: ignore[union-attr]
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(message or str(code))
    return AgentrtError(message or str(code))
