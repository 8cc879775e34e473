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

import atexit
import hashlib
import json
import logging
import math
import os
import re
import sys
import threading
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


# absl's line, as gRPC's C core writes it: "I1203 21:11:19.034858    7884 ssl_transport_security.cc:2563] text"
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([^\]]+)\] ?(.*)$")
_ABSL_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}


def capture_native_stderr() -> None:
    """With `log_format: json`, every line on stderr is JSON: native code (gRPC's C core logs through
    absl straight to file descriptor 2, past Python's logging) is read back as records of logger
    `grpc.core` (absl's level and source file kept), anything else written to fd 2 as logger `stderr`.

    Call after setup_logging: the root logger's stream handlers move to a duplicate of the real
    stderr, fd 2 becomes a pipe a daemon thread reads, and at exit the pipe is drained.
    """
    real = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(real)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    reader = threading.Thread(target=_forward_native_lines, args=(read_fd,), name="native-stderr", daemon=True)
    reader.start()

    def drain() -> None:
        sys.stderr.flush()
        os.dup2(real.fileno(), 2)  # the pipe's last write end closes: the reader reads to its end
        reader.join(timeout=2)

    atexit.register(drain)


def _forward_native_lines(read_fd: int) -> None:
    core, other = logging.getLogger("grpc.core"), logging.getLogger("stderr")
    with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            text = line.rstrip("\n")
            if not text.strip():
                continue
            absl = _ABSL_LINE.match(text)
            if absl:
                core.log(_ABSL_LEVELS[absl.group(1)], absl.group(3), extra={"source": absl.group(2)})
            else:
                other.warning(text)
