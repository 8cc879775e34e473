"""What every tool adapter promises: send once, classify the outcome, and (optionally) look up by key."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
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


class ToolNotCallable(Exception):
    """A tool's callable cannot take the arguments it is called with: it never ran (a definite failure)."""


def signature_of(func: Callable[..., Any]) -> inspect.Signature | None:
    """The signature calls are bound against (None: a builtin without one, left to the call itself)."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def bind_or_refuse(name: str, signature: inspect.Signature | None, *args: Any) -> None:
    """Binds a call's arguments before it is made: a call that cannot bind never started, so it is a
    definite failure (ToolNotCallable), never the unknown outcome of an exception raised inside the tool."""
    if signature is None:
        return
    problem = _binding_problem(signature, len(args))
    if problem is not None:
        raise ToolNotCallable(f"{name}{signature}: {problem}")


@functools.lru_cache(maxsize=1024)
def _binding_problem(signature: inspect.Signature, count: int) -> str | None:
    """Why `count` positional arguments do not bind to `signature` (None: they do). Binding positional
    arguments depends on their number alone, so a tool's answer is worked out once, not per call."""
    try:
        signature.bind(*(None,) * count)
    except TypeError as exc:
        return str(exc)
    return None
