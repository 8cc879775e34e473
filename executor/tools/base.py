"""What every tool adapter promises: send once, classify the outcome, and (optionally) look up by key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class ToolCallContext:
    run_id: str
    tenant_id: str
    step_key: str
    idempotency_key: str
    fencing_token: int
    headers: dict[str, str] = field(default_factory=dict)  # W3C trace context, set by the executor


@dataclass(frozen=True)
class ToolOutcome:
    """`ok` with a response, or an error code from executor.errors.ERROR_CODES."""

    ok: bool
    response: Any = None
    remote_resource_id: str | None = None
    error_code: str = ""
    detail: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def success(cls, response: Any, remote_resource_id: str | None = None) -> ToolOutcome:
        return cls(True, response=response, remote_resource_id=remote_resource_id)

    @classmethod
    def failure(cls, error_code: str, detail: str = "", **evidence: Any) -> ToolOutcome:
        return cls(False, error_code=error_code, detail=detail[:2000], evidence=evidence)


@dataclass(frozen=True)
class LookupOutcome:
    """found: it ran (with its result); not_found: it provably never ran; unknown: cannot tell."""

    status: Literal["found", "not_found", "unknown"]
    response: Any = None
    remote_resource_id: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


class ToolAdapter(Protocol):
    async def call(self, request: dict[str, Any], ctx: ToolCallContext) -> ToolOutcome: ...

    async def lookup(self, ctx: ToolCallContext) -> LookupOutcome: ...

    async def close(self) -> None: ...


class ToolRefused(Exception):
    """Raised by a python tool: definitely not executed (a definite, no-side-effect failure)."""


class ToolRetryLater(Exception):
    """Raised by a python tool: not accepted now, nothing happened; try again later."""
