"""shared/logs.py: the JSON line of a record, the run it names, and what a log line may say about a payload."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from pydantic import ValidationError

from shared.config import ComponentSettings
from shared.logs import JsonFormatter, bind_run, bound_run, formatter, payload_digest, unbind_run
from shared.tracing import annotate, continued

RFC3339_MS_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
SECRET = "s3cr3t-7f2a9c"


def record(message: str = "hello %s", *args: Any, level: int = logging.INFO, exc_info: Any = None,
           **extra: Any) -> logging.LogRecord:
    return logging.getLogger("agentrt.test").makeRecord(
        "agentrt.test", level, __file__, 1, message, args or (("world",) if "%s" in message else ()), exc_info,
        extra=extra or None)


def line(entry: logging.LogRecord, service: str = "agentrt-test") -> dict[str, Any]:
    text = JsonFormatter(service).format(entry)
    assert "\n" not in text
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def test_a_line_has_time_level_service_logger_and_message() -> None:
    entry = line(record())
    assert RFC3339_MS_UTC.match(entry["time"]), entry["time"]
    assert (entry["level"], entry["service"], entry["logger"], entry["message"]) == (
        "INFO", "agentrt-test", "agentrt.test", "hello world")
    assert not {"trace_id", "span_id", "run_id", "tenant", "fencing_token", "exc", "exc_type"} & set(entry)


def test_the_time_is_utc_with_milliseconds() -> None:
    made = record()
    made.created, made.msecs = 0.042, 42.0
    assert line(made)["time"] == "1970-01-01T00:00:00.042Z"


def test_an_exception_is_a_type_and_the_traceback_on_one_line() -> None:
    try:
        raise KeyError("customer_id")
    except KeyError:
        import sys

        entry = line(record("failed", level=logging.ERROR, exc_info=sys.exc_info()))
    assert entry["exc_type"] == "KeyError"
    assert entry["exc"].startswith("Traceback (most recent call last):") and "KeyError: 'customer_id'" in entry["exc"]


def test_an_exception_of_a_module_is_named_with_its_module() -> None:
    from shared.errors import InvalidArgument

    try:
        raise InvalidArgument("run_id", "is not a UUID")
    except InvalidArgument:
        import sys

        entry = line(record("failed", level=logging.ERROR, exc_info=sys.exc_info()))
    assert entry["exc_type"] == "shared.errors.InvalidArgument"


@pytest.mark.parametrize("sampler", [ALWAYS_OFF, ALWAYS_ON], ids=["not-sampled", "sampled"])
def test_trace_and_span_ids_come_from_the_current_span_context(sampler: Any) -> None:
    tracer = TracerProvider(sampler=sampler).get_tracer("test")
    with tracer.start_as_current_span("call") as span:
        entry = line(record())
        assert span.is_recording() is (sampler is ALWAYS_ON)
    context = span.get_span_context()
    assert context.is_valid
    assert entry["trace_id"] == f"{context.trace_id:032x}" and len(entry["trace_id"]) == 32
    assert entry["span_id"] == f"{context.span_id:016x}" and len(entry["span_id"]) == 16


def test_a_continued_caller_context_names_the_callers_trace() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    with continued({"traceparent": parent}):
        entry = line(record())
    assert (entry["trace_id"], entry["span_id"]) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")


def test_extras_are_fields_and_what_json_cannot_hold_becomes_its_repr() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    circular: list[Any] = []
    circular.append(circular)
    entry = line(record(attempt=3, ok=True, where=Opaque(), keys={(1, 2): "x"}, ratio=float("nan"),
                        loop=circular, names=["a", "b"], time="not the time"))
    assert (entry["attempt"], entry["ok"], entry["names"]) == (3, True, ["a", "b"])
    assert entry["where"] == "<opaque>" and entry["keys"] == "{(1, 2): 'x'}" and entry["ratio"] == "nan"
    assert entry["loop"] == "[[...]]"
    assert RFC3339_MS_UTC.match(entry["time"])  # an extra never replaces a core field


def test_extras_name_the_run_and_win_over_the_bound_run() -> None:
    async def in_a_task() -> dict[str, Any]:
        bind_run(run_id="run-a", tenant="tenant-a", fencing_token=1)
        return line(record(run_id="run-b", tenant_id="tenant-b", fencing_token=2))

    assert {k: v for k, v in asyncio.run(in_a_task()).items() if k in ("run_id", "tenant", "fencing_token")} == {
        "run_id": "run-b", "tenant": "tenant-b", "fencing_token": 2}


def test_annotate_binds_the_run_for_the_task_and_nothing_leaks_out_of_it() -> None:
    async def call(run_id: str, fence: int) -> dict[str, Any]:
        annotate(run_id=run_id, fencing_token=fence, worker_id="w1", step_key="s1")
        annotate(tenant_id="tenant-a")
        await asyncio.sleep(0)
        return line(record())

    async def main() -> list[dict[str, Any]]:
        return list(await asyncio.gather(call("run-1", 1), call("run-2", 7)))

    first, second = asyncio.run(main())
    assert (first["run_id"], first["fencing_token"], first["tenant"]) == ("run-1", 1, "tenant-a")
    assert (second["run_id"], second["fencing_token"]) == ("run-2", 7)
    assert "worker_id" not in first and "step_key" not in first
    assert bound_run() == {} and "run_id" not in line(record())


def test_unbind_restores_what_was_bound_before() -> None:
    async def main() -> None:
        bind_run(run_id="outer")
        token = bind_run(run_id="inner", fencing_token=3)
        assert bound_run() == {"run_id": "inner", "fencing_token": 3}
        unbind_run(token)
        assert bound_run() == {"run_id": "outer"}
        assert bind_run(run_id="outer") is None  # unchanged: nothing set

    asyncio.run(main())


def test_a_record_the_level_filters_out_is_never_formatted() -> None:
    formatted: list[logging.LogRecord] = []

    class Counting(JsonFormatter):
        def format(self, record: logging.LogRecord) -> str:
            formatted.append(record)
            return super().format(record)

    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(Counting("agentrt-test"))
    logger = logging.getLogger("agentrt.test.filtered")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        logger.debug("state %s", SimpleNamespace(expensive=True))
        logger.warning("kept")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in formatted] == ["kept"]


def test_payload_digest_says_size_and_digest_never_the_value() -> None:
    text = json.dumps({"card": SECRET})
    digest = payload_digest(text)
    assert SECRET not in digest and digest.startswith(f"{len(text)} bytes, sha256:")
    assert digest == payload_digest(text.encode()) and digest != payload_digest(text + " ")
    assert payload_digest(None) == payload_digest("") == payload_digest(b"")


def test_log_format_is_text_by_default_and_only_text_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRT_LOG_FORMAT", raising=False)
    assert ComponentSettings().log_format == "text"
    monkeypatch.setenv("AGENTRT_LOG_FORMAT", "json")
    assert ComponentSettings().log_format == "json"
    monkeypatch.setenv("AGENTRT_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError):
        ComponentSettings()
    assert isinstance(formatter("json", "x"), JsonFormatter)
    assert "%(levelname)s" in (formatter("text", "x")._fmt or "")
    with pytest.raises(ValueError):
        formatter("xml", "x")  # type: ignore[arg-type]


PAYLOAD_NAME = re.compile(r"(^|\.)(\w+_json|evidence|detail|body|payload|inputs?|state|response|arguments|data)"
                          r"(\[[^\]]*\])?$")


def test_no_log_call_passes_a_payload_value() -> None:
    """Inputs, tool requests and answers, checkpoints and evidence reach logs only as payload_digest(...)."""
    import ast

    from tests_paths import REPO

    offenders = []
    for package in ("scheduler", "executor", "relay", "shared"):
        for path in sorted((REPO / package).rglob("*.py")):
            if "gen" in path.relative_to(REPO).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "log"):
                    continue
                for arg in [*node.args[1:], *(k.value for k in node.keywords if k.arg != "exc_info")]:
                    if PAYLOAD_NAME.search(ast.unparse(arg)):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(arg)}")
    assert not offenders, offenders


async def test_a_finished_runs_reason_is_logged_as_its_digest(caplog: pytest.LogCaptureFixture) -> None:
    from executor.runlease import RunLease
    from shared.gen.agentrt.v1 import common_pb2 as pb
    from shared.gen.agentrt.v1 import work_service_pb2 as ws

    class Client:
        async def finish_run(self, request: ws.FinishRunRequest, give_up_at: float) -> Any:
            return SimpleNamespace(status=pb.RUN_STATUS_COMPLETED)

    claim = ws.Lease(run=pb.Run(run_id="run-1", fencing_token=1))
    held = SimpleNamespace(ref=ws.LeaseRef(run_id="run-1", fencing_token=1), give_up_at=lambda: 0.0)
    lease = RunLease(claim, held, Client(), None)  # type: ignore[arg-type]
    reason = f"refund sent to {SECRET}"
    with caplog.at_level(logging.INFO, logger="executor.runlease"):
        await lease.finish(ws.FINISH_OUTCOME_COMPLETED, reason, error_class="permanent:x")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [f"run run-1 -> RUN_STATUS_COMPLETED permanent:x (reason {payload_digest(reason)})"]
    assert not any(SECRET in m for m in messages)
