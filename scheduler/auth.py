"""WorkService authentication: a shared executor token, checked before any handler runs.

WorkService hands out leases on every tenant's runs, so only executors may
call it. When `work_token` is set, each WorkService call must carry the
metadata `authorization: Bearer <token>`; anything else answers
UNAUTHENTICATED and reaches no handler. RunService is not affected (it is
scoped by tenant). Unset, WorkService is open: development only.
"""

from __future__ import annotations

import hmac
from typing import Any

import grpc

from shared.errors import ExecutorTokenRequired, to_grpc_status

WORK_SERVICE_PREFIX = "/agentrt.v1.WorkService/"


class WorkServiceAuth(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(WORK_SERVICE_PREFIX):
            return handler
        presented = next((value for key, value in (details.invocation_metadata or ()) if key == "authorization"), "")
        if isinstance(presented, str) and hmac.compare_digest(presented.encode(), self._expected):
            return handler

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort_with_status(to_grpc_status(ExecutorTokenRequired(
                "WorkService is for executors: present the executor token as `authorization: Bearer …`")))

        return grpc.unary_unary_rpc_method_handler(refuse, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)
