"""Logging for every service: text for a person at a terminal, or one JSON object per line.

`log_format: json` makes each record one line with `time` (RFC 3339, UTC, ms), `level`,
`service`, `logger`, `message`; `trace_id` and `span_id` of the current OpenTelemetry
context (unsampled spans have ids too: the context is propagated whatever the exporter);
`run_id`, `tenant` and `fencing_token` of the run the task works on (bind_run, which
tracing.annotate calls, or `extra=`); other `extra=` fields; and `exc_type` / `exc` (the
traceback as one string) for an exception.

Logs are read by people who may not read the runs: never log payload values (inputs, tool
requests and answers, checkpoints, evidence, free-text reasons built from them). Log their
size and digest instead (payload_digest); the values stay behind the API's tenant checks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import time
from contextvars import ContextVar, Token
from typing import Any, Literal

from opentelemetry import trace

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The run the current task works on. Set per task: each gRPC call and each executor run is its
# own asyncio task, so a binding never outlives the call or the run it names.
_RUN: ContextVar[dict[str, Any] | None] = ContextVar("agentrt_log_run", default=None)
# annotate() spells the tenant tenant_id (the span attribute); the log field is `tenant`.
_BOUND_NAMES = {"run_id": "run_id", "tenant_id": "tenant", "tenant": "tenant", "fencing_token": "fencing_token"}
_CORE = ("time", "level", "service", "logger", "message")
# Attributes every LogRecord has; anything else on a record came with extra=.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def bind_run(run_id: Any = None, tenant: Any = None, fencing_token: Any = None,
             ) -> Token[dict[str, Any] | None] | None:
    """Names the run in this task's log records (None keeps what is bound).

    Returns the token to reset with unbind_run, or None when nothing changed.
    """
    current = _RUN.get()
    fields = dict(current) if current else {}
    if run_id is not None:
        fields["run_id"] = str(run_id)
    if tenant is not None:
        fields["tenant"] = tenant
    if fencing_token is not None:
        fields["fencing_token"] = fencing_token
    if fields == (current or {}):
        return None
    return _RUN.set(fields)


def bind_annotations(attributes: dict[str, Any]) -> None:
    """bind_run for span annotations (tracing.annotate): run_id, tenant_id, fencing_token; cheap without them."""
    if "run_id" in attributes or "tenant_id" in attributes or "fencing_token" in attributes:
        bind_run(attributes.get("run_id"), attributes.get("tenant_id"), attributes.get("fencing_token"))


def unbind_run(token: Token[dict[str, Any] | None] | None) -> None:
    if token is not None:
        _RUN.reset(token)


def bound_run() -> dict[str, Any]:
    return dict(_RUN.get() or {})


def payload_digest(value: str | bytes | None) -> str:
    """What a log line may say about a payload: its size and a short digest, never the value."""
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else (value or b"")
    return f"{len(data)} bytes, sha256:{hashlib.sha256(data).hexdigest()[:16]}"


def _rfc3339(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # NaN is no JSON
    if isinstance(value, str | int | bool) or value is None:
        return value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring for the fields)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        # Runs only for records a logger's level let through: the hot path pays nothing otherwise.
        entry: dict[str, Any] = {"time": _rfc3339(record), "level": record.levelname, "service": self.service,
                                 "logger": record.name, "message": record.getMessage()}
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = format(context.trace_id, "032x")
            entry["span_id"] = format(context.span_id, "016x")
        bound = _RUN.get()
        if bound:
            entry.update(bound)
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and key not in _CORE:
                entry[_BOUND_NAMES.get(key, key)] = _jsonable(value)
        if record.exc_info and record.exc_info[0] is not None:
            kind = record.exc_info[0]
            entry["exc_type"] = kind.__qualname__ if kind.__module__ == "builtins" else \
                f"{kind.__module__}.{kind.__qualname__}"
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=repr)


def formatter(log_format: LogFormat, service: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter(service)
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"log_format must be text or json, got {log_format!r}")


def setup_logging(level: str, log_format: LogFormat = "text", service: str = "agentrt") -> None:
    """The root logger writes to stderr in `log_format` (once per process, as logging.basicConfig)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format, service))
    logging.basicConfig(level=level.upper(), handlers=[handler])
