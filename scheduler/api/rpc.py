"""What the RPC handlers share: the typed-error-to-status wrapper, the lease and event id of a
request, and the enum maps and limits of both services.

Handlers validate, call the Store, and convert; they hold no SQL. Every typed
error becomes a gRPC status through shared.errors' one table; anything else is
logged here and answered INTERNAL without a stack trace.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from scheduler.api import convert
from scheduler.api import validate as v
from scheduler.api.auth import Principal
from scheduler.api.wire import MalformedRequest
from scheduler.bounds import MAX_WAIT_MS, check_request
from scheduler.store import LeaseRef
from shared.canonical import uuid7
from shared.errors import AgentrtError, CredentialRequired, InvalidArgument, status_code_for, to_grpc_status
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws
from shared.tracing import annotate

log = logging.getLogger("scheduler.service")
R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]
_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("principal", default=None)

STATUS_FILTER = {number: name for name, number in convert.RUN_STATUS.items()}
RESUME = {rs.RESUME_DECISION_APPROVE: "APPROVE", rs.RESUME_DECISION_REJECT: "REJECT",
           rs.RESUME_DECISION_INPUT: "INPUT"}
RESOLVE = {rs.RESOLUTION_OUTCOME_SUCCEEDED: "SUCCEEDED", rs.RESOLUTION_OUTCOME_NOT_EXECUTED: "NOT_EXECUTED",
            rs.RESOLUTION_OUTCOME_UNKNOWN: "UNKNOWN"}
TOOL_OUTCOME = {ws.TOOL_OUTCOME_SUCCEEDED: "SUCCEEDED", ws.TOOL_OUTCOME_FAILED: "FAILED",
                 ws.TOOL_OUTCOME_NOT_EXECUTED: "NOT_EXECUTED"}
HISTORY_PART = {rs.HISTORY_PART_CHECKPOINTS: "checkpoints", rs.HISTORY_PART_TOOL_EXECUTIONS: "tool_executions",
                 rs.HISTORY_PART_EVENTS: "events", rs.HISTORY_PART_JOURNAL: "journal"}
DEFINITE_OUTCOME = {ws.TOOL_OUTCOME_SUCCEEDED: "SUCCEEDED", ws.TOOL_OUTCOME_FAILED: "FAILED"}
FINISH_OUTCOME = {ws.FINISH_OUTCOME_COMPLETED: "COMPLETED", ws.FINISH_OUTCOME_FAILED: "FAILED",
           ws.FINISH_OUTCOME_PAUSED_HUMAN: "PAUSED_HUMAN", ws.FINISH_OUTCOME_RETRY: "RETRY",
           ws.FINISH_OUTCOME_SLEEP: "SLEEP"}
DEFAULT_JOURNAL_PAGE_SIZE = 1000
MAX_TOOL_RESULT_STEPS = 500  # GetToolResults
MAX_SLEEP_MS = MAX_WAIT_MS


def rpc(handler: Handler[R]) -> Handler[R]:
    """Maps typed errors to statuses; nothing else (and no stack trace) reaches the client.

    First the servicer's `guard` (scheduler/api/auth.py) admits the caller, or refuses before
    anything is read; the principal it admits is `principal()` for the handler. Bytes that did
    not decode as the request message arrive as a MalformedRequest (wire.py) and are answered
    INVALID_ARGUMENT before the handler runs, and so is a number outside its bound
    (scheduler/bounds.py: one table for every numeric field of every request).
    """

    async def core(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        # WriteBatch calls this for each item, as its own call. Bounds first: they read nothing.
        check_request(request)
        # The one sealing filter (scheduler/api/shield.py): whatever the handler writes about the run, it
        # sees the run's marked values sealed or redacted already.
        if not isinstance(request, MalformedRequest):
            await self.shield.seal_request(request)
        return await handler(self, request, context)

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        token = None
        try:
            admitted = await self.guard(handler.__name__, context)
            if admitted is not None:
                token = _PRINCIPAL.set(admitted)
                annotate(principal=admitted.id)
            if isinstance(request, MalformedRequest):
                raise request.error()
            reply = await core(self, request, context)
            # The handler's annotate() bound the run for this call's records (shared/logs.py).
            log.debug("%s answered", handler.__name__)
            return reply
        except AgentrtError as error:
            annotate(error_reason=error.reason)
            log.debug("%s refused: %s", handler.__name__, error.reason)
            refused = getattr(self, "refused", None)  # the WorkService's metrics hook (work_service.py)
            if refused is not None:
                refused(handler.__name__, error.reason)
            await context.abort_with_status(to_grpc_status(error))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("unhandled error in %s", handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error (logged by the scheduler)")
        finally:
            if token is not None:
                _PRINCIPAL.reset(token)
        raise AssertionError("unreachable")

    wrapper.core = core  # type: ignore[attr-defined]  # the body without the status mapping (WriteBatch)
    return wrapper


def principal() -> Principal:
    """The caller the guard admitted for the RPC being handled (ANONYMOUS with auth_mode none).

    Fails closed: code that reaches here without the guard (no principal set) is refused.
    """
    admitted = _PRINCIPAL.get()
    if admitted is None:
        raise CredentialRequired("no authenticated caller for this call")
    return admitted


def lease_of(request: Any) -> LeaseRef:
    run_id, worker, fence = v.require_lease(request.lease)
    annotate(run_id=str(run_id), fencing_token=fence, worker_id=worker)
    return LeaseRef(run_id, worker, fence)


def event_id_of(value: str) -> uuid.UUID:
    return v.require_uuid("event_id", value)


def expected_version_of(value: int) -> int:
    if value < 0:
        raise InvalidArgument("expected_version", "must not be negative")
    return value


def batch_error(error: AgentrtError) -> ws.WriteBatchError:
    code = status_code_for(error)
    return ws.WriteBatchError(code=code.value[0], message=error.message, reason=error.reason,
                              metadata=error.metadata)



def new_event_id() -> str:
    return str(uuid7())
