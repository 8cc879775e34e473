"""The `python` tool adapter: an in-process callable by import path, with the http adapter's contract.

The callable gets (arguments, ToolCallContext) and returns a JSON value (or a
ToolOutcome). ToolRefused → a definite failure, ToolRetryLater → transient;
any other exception, or a timeout, is an unknown outcome: it may have acted.
Synchronous callables run inline and must be quick.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

from executor.agents import PythonTool
from executor.tools.base import (
    LookupOutcome,
    ToolCallContext,
    ToolNotCallable,
    ToolOutcome,
    ToolRefused,
    ToolRetryLater,
    bind_or_refuse,
    signature_of,
)

log = logging.getLogger(__name__)


class CallableImportError(Exception):
    """A tool's callable (or lookup_callable) cannot be imported, or cannot be called as declared."""

    def __init__(self, field: str, exc: BaseException | None = None, message: str = "") -> None:
        super().__init__(message or f"cannot import: {type(exc).__name__}: {exc}")
        self.field = field


def check_signature(path: str, func: Callable[..., Any], expected: str) -> str | None:
    """Why `func` cannot be called with two positional arguments (None: it can, or it shows no signature).

    Checked when the executor starts (and when a code-first tool is declared), not found as the
    unknown outcome of the first call.
    """
    signature = signature_of(func)
    if signature is None:  # a builtin without a signature: the call itself is bound (bind_or_refuse)
        return None
    try:
        signature.bind(object(), object())
    except TypeError as exc:
        return f"{path}{signature} cannot be called as {expected}: {exc}"
    return None


def _check_signature(field: str, path: str, func: Callable[..., Any], expected: str) -> None:
    problem = check_signature(path, func, expected)
    if problem is not None:
        raise CallableImportError(field, message=problem)


def import_callable(path: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{path} is not callable")
    return target  # type: ignore[no-any-return]


async def _invoke(path: str, func: Callable[..., Any], signature: inspect.Signature | None, timeout_s: float,
                  *args: Any) -> Any:
    bind_or_refuse(path, signature, *args)
    result = func(*args)
    if inspect.isawaitable(result):
        return await asyncio.wait_for(result, timeout_s)
    return result


class PythonToolAdapter:
    def __init__(self, tool: PythonTool) -> None:
        self.tool = tool
        self.func = self._import("callable", tool.callable)
        _check_signature("callable", tool.callable, self.func, "(arguments, ToolCallContext)")
        self.signature = signature_of(self.func)
        self.lookup_func = self._import("lookup_callable", tool.lookup_callable) if tool.lookup_callable else None
        self.lookup_signature = signature_of(self.lookup_func) if self.lookup_func is not None else None
        if self.lookup_func is not None:
            _check_signature("lookup_callable", str(tool.lookup_callable), self.lookup_func,
                             "(idempotency_key, ToolCallContext)")

    @staticmethod
    def _import(field: str, path: str) -> Callable[..., Any]:
        try:
            return import_callable(path)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise CallableImportError(field, exc) from None

    async def call(self, request: dict[str, Any], ctx: ToolCallContext) -> ToolOutcome:
        try:
            result = await _invoke(self.tool.callable, self.func, self.signature, self.tool.timeout_s, request, ctx)
        except ToolRefused as exc:
            return ToolOutcome.failure("tool_refused", str(exc))
        except ToolNotCallable as exc:
            return ToolOutcome.failure("tool_not_callable", str(exc))
        except ToolRetryLater as exc:
            return ToolOutcome.failure("tool_busy", str(exc))
        except TimeoutError:
            return ToolOutcome.failure("timeout", f"no answer within {self.tool.timeout_s}s")
        except Exception as exc:
            # It may have acted before it raised: an unknown outcome. Its type and message go to the
            # log here and, with the in-doubt freeze, to the run's pause reason and history.
            log.warning("tool %s at %s raised %s: %s", self.tool.name, ctx.step_key, type(exc).__name__, exc,
                        exc_info=exc)
            return ToolOutcome.failure("tool_crashed", f"{type(exc).__name__}: {exc}")
        if isinstance(result, ToolOutcome):
            return result
        remote = result.get("id") if isinstance(result, dict) else None
        return ToolOutcome.success(result, str(remote) if remote is not None else None)

    async def lookup(self, ctx: ToolCallContext) -> LookupOutcome:
        if self.lookup_func is None:
            return LookupOutcome("unknown", evidence={"reason": "tool has no lookup contract"})
        try:
            result = await _invoke(str(self.tool.lookup_callable), self.lookup_func, self.lookup_signature,
                                   self.tool.timeout_s, ctx.idempotency_key, ctx)
        except Exception as exc:
            return LookupOutcome("unknown", evidence={"error": f"{type(exc).__name__}: {exc}"[:500]})
        if not isinstance(result, LookupOutcome):
            return LookupOutcome("unknown", evidence={"error": "lookup did not return a LookupOutcome"})
        return result

    async def close(self) -> None:
        return None
