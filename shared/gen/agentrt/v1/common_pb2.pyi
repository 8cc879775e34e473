import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_QUEUED: _ClassVar[RunStatus]
    RUN_STATUS_RUNNING: _ClassVar[RunStatus]
    RUN_STATUS_WAITING_TOOL: _ClassVar[RunStatus]
    RUN_STATUS_PAUSED_INDOUBT: _ClassVar[RunStatus]
    RUN_STATUS_PAUSED_HUMAN: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]

class ToolExecutionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_EXECUTION_STATUS_UNSPECIFIED: _ClassVar[ToolExecutionStatus]
    TOOL_EXECUTION_STATUS_OUTBOUND_INTENT: _ClassVar[ToolExecutionStatus]
    TOOL_EXECUTION_STATUS_SUCCEEDED: _ClassVar[ToolExecutionStatus]
    TOOL_EXECUTION_STATUS_FAILED: _ClassVar[ToolExecutionStatus]
    TOOL_EXECUTION_STATUS_IN_DOUBT: _ClassVar[ToolExecutionStatus]
    TOOL_EXECUTION_STATUS_NOT_EXECUTED: _ClassVar[ToolExecutionStatus]
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_QUEUED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_WAITING_TOOL: RunStatus
RUN_STATUS_PAUSED_INDOUBT: RunStatus
RUN_STATUS_PAUSED_HUMAN: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_CANCELLED: RunStatus
TOOL_EXECUTION_STATUS_UNSPECIFIED: ToolExecutionStatus
TOOL_EXECUTION_STATUS_OUTBOUND_INTENT: ToolExecutionStatus
TOOL_EXECUTION_STATUS_SUCCEEDED: ToolExecutionStatus
TOOL_EXECUTION_STATUS_FAILED: ToolExecutionStatus
TOOL_EXECUTION_STATUS_IN_DOUBT: ToolExecutionStatus
TOOL_EXECUTION_STATUS_NOT_EXECUTED: ToolExecutionStatus

class Budget(_message.Message):
    __slots__ = ("max_steps", "max_tokens", "max_cost_usd", "deadline")
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_USD_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    max_steps: int
    max_tokens: int
    max_cost_usd: float
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, max_steps: _Optional[int] = ..., max_tokens: _Optional[int] = ..., max_cost_usd: _Optional[float] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BudgetUsage(_message.Message):
    __slots__ = ("steps", "tokens", "cost_usd")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    steps: int
    tokens: int
    cost_usd: float
    def __init__(self, steps: _Optional[int] = ..., tokens: _Optional[int] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class Signal(_message.Message):
    __slots__ = ("seq", "signal_id", "name", "payload_json", "received_at", "request_id")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    seq: int
    signal_id: str
    name: str
    payload_json: str
    received_at: _timestamp_pb2.Timestamp
    request_id: str
    def __init__(self, seq: _Optional[int] = ..., signal_id: _Optional[str] = ..., name: _Optional[str] = ..., payload_json: _Optional[str] = ..., received_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "tenant_id", "agent_name", "agent_version", "status", "version", "fencing_token", "attempt_count", "max_attempts", "input_json", "labels", "budget", "current_step_key", "terminal_reason", "pause_reason", "cancel_requested", "client_request_id", "result_json", "next_attempt_at", "created_at", "updated_at", "finished_at", "lease_owner", "lease_expires_at", "human_input_json", "last_trace_id", "priority", "parent_run_id", "waiting_for", "retry_of_run_id")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_REASON_FIELD_NUMBER: _ClassVar[int]
    PAUSE_REASON_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    HUMAN_INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    LAST_TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    RETRY_OF_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_id: str
    agent_name: str
    agent_version: str
    status: RunStatus
    version: int
    fencing_token: int
    attempt_count: int
    max_attempts: int
    input_json: str
    labels: _containers.ScalarMap[str, str]
    budget: Budget
    current_step_key: str
    terminal_reason: str
    pause_reason: str
    cancel_requested: bool
    client_request_id: str
    result_json: str
    next_attempt_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    lease_owner: str
    lease_expires_at: _timestamp_pb2.Timestamp
    human_input_json: str
    last_trace_id: str
    priority: int
    parent_run_id: str
    waiting_for: str
    retry_of_run_id: str
    def __init__(self, run_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., agent_name: _Optional[str] = ..., agent_version: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., version: _Optional[int] = ..., fencing_token: _Optional[int] = ..., attempt_count: _Optional[int] = ..., max_attempts: _Optional[int] = ..., input_json: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., current_step_key: _Optional[str] = ..., terminal_reason: _Optional[str] = ..., pause_reason: _Optional[str] = ..., cancel_requested: _Optional[bool] = ..., client_request_id: _Optional[str] = ..., result_json: _Optional[str] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_owner: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., human_input_json: _Optional[str] = ..., last_trace_id: _Optional[str] = ..., priority: _Optional[int] = ..., parent_run_id: _Optional[str] = ..., waiting_for: _Optional[str] = ..., retry_of_run_id: _Optional[str] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("run_id", "version", "state_json", "state_hash", "schema_version", "fencing_token", "event_id", "created_at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_HASH_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    state_json: str
    state_hash: str
    schema_version: int
    fencing_token: int
    event_id: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., state_json: _Optional[str] = ..., state_hash: _Optional[str] = ..., schema_version: _Optional[int] = ..., fencing_token: _Optional[int] = ..., event_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ToolExecution(_message.Message):
    __slots__ = ("execution_id", "run_id", "step_key", "tool_name", "idempotency_key", "request_json", "request_hash", "status", "remote_resource_id", "response_json", "error_code", "fencing_token", "outbound_intent_at", "completed_at", "reconciled_at", "reconciliation_evidence_json")
    EXECUTION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HASH_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTBOUND_INTENT_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    RECONCILED_AT_FIELD_NUMBER: _ClassVar[int]
    RECONCILIATION_EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    execution_id: str
    run_id: str
    step_key: str
    tool_name: str
    idempotency_key: str
    request_json: str
    request_hash: str
    status: ToolExecutionStatus
    remote_resource_id: str
    response_json: str
    error_code: str
    fencing_token: int
    outbound_intent_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    reconciled_at: _timestamp_pb2.Timestamp
    reconciliation_evidence_json: str
    def __init__(self, execution_id: _Optional[str] = ..., run_id: _Optional[str] = ..., step_key: _Optional[str] = ..., tool_name: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., request_json: _Optional[str] = ..., request_hash: _Optional[str] = ..., status: _Optional[_Union[ToolExecutionStatus, str]] = ..., remote_resource_id: _Optional[str] = ..., response_json: _Optional[str] = ..., error_code: _Optional[str] = ..., fencing_token: _Optional[int] = ..., outbound_intent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reconciled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reconciliation_evidence_json: _Optional[str] = ...) -> None: ...

class OutboxEvent(_message.Message):
    __slots__ = ("id", "event_id", "run_id", "event_type", "payload_json", "fencing_token", "run_version", "traceparent", "created_at", "published_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    id: int
    event_id: str
    run_id: str
    event_type: str
    payload_json: str
    fencing_token: int
    run_version: int
    traceparent: str
    created_at: _timestamp_pb2.Timestamp
    published_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., event_id: _Optional[str] = ..., run_id: _Optional[str] = ..., event_type: _Optional[str] = ..., payload_json: _Optional[str] = ..., fencing_token: _Optional[int] = ..., run_version: _Optional[int] = ..., traceparent: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., published_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class JournalEntry(_message.Message):
    __slots__ = ("seq", "kind", "step_key", "node", "tool", "detail_json", "run_version", "created_at")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    RUN_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: str
    step_key: str
    node: str
    tool: str
    detail_json: str
    run_version: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[str] = ..., step_key: _Optional[str] = ..., node: _Optional[str] = ..., tool: _Optional[str] = ..., detail_json: _Optional[str] = ..., run_version: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
