import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from shared.gen.agentrt.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_OUTCOME_UNSPECIFIED: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_SUCCEEDED: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_FAILED: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_NOT_EXECUTED: _ClassVar[ToolOutcome]

class FinishOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_OUTCOME_UNSPECIFIED: _ClassVar[FinishOutcome]
    FINISH_OUTCOME_COMPLETED: _ClassVar[FinishOutcome]
    FINISH_OUTCOME_FAILED: _ClassVar[FinishOutcome]
    FINISH_OUTCOME_PAUSED_HUMAN: _ClassVar[FinishOutcome]
    FINISH_OUTCOME_RETRY: _ClassVar[FinishOutcome]
    FINISH_OUTCOME_SLEEP: _ClassVar[FinishOutcome]

class JoinMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOIN_MODE_UNSPECIFIED: _ClassVar[JoinMode]
    JOIN_MODE_ALL: _ClassVar[JoinMode]
    JOIN_MODE_ANY: _ClassVar[JoinMode]
TOOL_OUTCOME_UNSPECIFIED: ToolOutcome
TOOL_OUTCOME_SUCCEEDED: ToolOutcome
TOOL_OUTCOME_FAILED: ToolOutcome
TOOL_OUTCOME_NOT_EXECUTED: ToolOutcome
FINISH_OUTCOME_UNSPECIFIED: FinishOutcome
FINISH_OUTCOME_COMPLETED: FinishOutcome
FINISH_OUTCOME_FAILED: FinishOutcome
FINISH_OUTCOME_PAUSED_HUMAN: FinishOutcome
FINISH_OUTCOME_RETRY: FinishOutcome
FINISH_OUTCOME_SLEEP: FinishOutcome
JOIN_MODE_UNSPECIFIED: JoinMode
JOIN_MODE_ALL: JoinMode
JOIN_MODE_ANY: JoinMode

class LeaseRef(_message.Message):
    __slots__ = ("run_id", "worker_id", "fencing_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    worker_id: str
    fencing_token: int
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class ClaimWorkRequest(_message.Message):
    __slots__ = ("worker_id", "agents", "wait_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    agents: _containers.RepeatedScalarFieldContainer[str]
    wait_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., agents: _Optional[_Iterable[str]] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("run", "lease_expires_at", "lease_duration_ms", "checkpoint", "pending_tool", "current_step_execution", "heartbeat_interval_ms", "limits", "journal_length", "signals", "last_signal_seq")
    RUN_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PENDING_TOOL_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_EXECUTION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    LAST_SIGNAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    lease_expires_at: _timestamp_pb2.Timestamp
    lease_duration_ms: int
    checkpoint: _common_pb2.Checkpoint
    pending_tool: _common_pb2.ToolExecution
    current_step_execution: _common_pb2.ToolExecution
    heartbeat_interval_ms: int
    limits: PayloadLimits
    journal_length: int
    signals: _containers.RepeatedCompositeFieldContainer[_common_pb2.Signal]
    last_signal_seq: int
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_duration_ms: _Optional[int] = ..., checkpoint: _Optional[_Union[_common_pb2.Checkpoint, _Mapping]] = ..., pending_tool: _Optional[_Union[_common_pb2.ToolExecution, _Mapping]] = ..., current_step_execution: _Optional[_Union[_common_pb2.ToolExecution, _Mapping]] = ..., heartbeat_interval_ms: _Optional[int] = ..., limits: _Optional[_Union[PayloadLimits, _Mapping]] = ..., journal_length: _Optional[int] = ..., signals: _Optional[_Iterable[_Union[_common_pb2.Signal, _Mapping]]] = ..., last_signal_seq: _Optional[int] = ...) -> None: ...

class PayloadLimits(_message.Message):
    __slots__ = ("max_tool_request_bytes", "max_tool_response_bytes", "max_checkpoint_bytes", "max_journal_entry_bytes", "max_payload_bytes")
    MAX_TOOL_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_JOURNAL_ENTRY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_tool_request_bytes: int
    max_tool_response_bytes: int
    max_checkpoint_bytes: int
    max_journal_entry_bytes: int
    max_payload_bytes: int
    def __init__(self, max_tool_request_bytes: _Optional[int] = ..., max_tool_response_bytes: _Optional[int] = ..., max_checkpoint_bytes: _Optional[int] = ..., max_journal_entry_bytes: _Optional[int] = ..., max_payload_bytes: _Optional[int] = ...) -> None: ...

class ClaimWorkResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_expires_at",)
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    lease_expires_at: _timestamp_pb2.Timestamp
    def __init__(self, lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("lease", "expected_version", "state_json", "schema_version", "step_key", "event_id", "event_type", "event_payload_json", "journal", "consume_signal_seqs")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENT_PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    CONSUME_SIGNAL_SEQS_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    expected_version: int
    state_json: str
    schema_version: int
    step_key: str
    event_id: str
    event_type: str
    event_payload_json: str
    journal: _containers.RepeatedCompositeFieldContainer[_common_pb2.JournalEntry]
    consume_signal_seqs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., expected_version: _Optional[int] = ..., state_json: _Optional[str] = ..., schema_version: _Optional[int] = ..., step_key: _Optional[str] = ..., event_id: _Optional[str] = ..., event_type: _Optional[str] = ..., event_payload_json: _Optional[str] = ..., journal: _Optional[_Iterable[_Union[_common_pb2.JournalEntry, _Mapping]]] = ..., consume_signal_seqs: _Optional[_Iterable[int]] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("version", "replayed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    version: int
    replayed: bool
    def __init__(self, version: _Optional[int] = ..., replayed: _Optional[bool] = ...) -> None: ...

class BeginToolCallRequest(_message.Message):
    __slots__ = ("lease", "expected_version", "step_key", "tool_name", "idempotency_key", "request_json", "execution_id", "event_id")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    expected_version: int
    step_key: str
    tool_name: str
    idempotency_key: str
    request_json: str
    execution_id: str
    event_id: str
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., expected_version: _Optional[int] = ..., step_key: _Optional[str] = ..., tool_name: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., request_json: _Optional[str] = ..., execution_id: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...

class BeginToolCallResponse(_message.Message):
    __slots__ = ("execution", "existing", "replayed")
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    execution: _common_pb2.ToolExecution
    existing: bool
    replayed: bool
    def __init__(self, execution: _Optional[_Union[_common_pb2.ToolExecution, _Mapping]] = ..., existing: _Optional[bool] = ..., replayed: _Optional[bool] = ...) -> None: ...

class CompleteToolCallRequest(_message.Message):
    __slots__ = ("lease", "expected_version", "step_key", "outcome", "response_json", "remote_resource_id", "error_code", "state_json", "schema_version", "next_step_key", "evidence_json", "event_id", "end", "journal")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_JSON_FIELD_NUMBER: _ClassVar[int]
    REMOTE_RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    expected_version: int
    step_key: str
    outcome: ToolOutcome
    response_json: str
    remote_resource_id: str
    error_code: str
    state_json: str
    schema_version: int
    next_step_key: str
    evidence_json: str
    event_id: str
    end: RunEnd
    journal: _containers.RepeatedCompositeFieldContainer[_common_pb2.JournalEntry]
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., expected_version: _Optional[int] = ..., step_key: _Optional[str] = ..., outcome: _Optional[_Union[ToolOutcome, str]] = ..., response_json: _Optional[str] = ..., remote_resource_id: _Optional[str] = ..., error_code: _Optional[str] = ..., state_json: _Optional[str] = ..., schema_version: _Optional[int] = ..., next_step_key: _Optional[str] = ..., evidence_json: _Optional[str] = ..., event_id: _Optional[str] = ..., end: _Optional[_Union[RunEnd, _Mapping]] = ..., journal: _Optional[_Iterable[_Union[_common_pb2.JournalEntry, _Mapping]]] = ...) -> None: ...

class RunEnd(_message.Message):
    __slots__ = ("outcome", "reason", "result_json", "error_class", "event_id")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    outcome: FinishOutcome
    reason: str
    result_json: str
    error_class: str
    event_id: str
    def __init__(self, outcome: _Optional[_Union[FinishOutcome, str]] = ..., reason: _Optional[str] = ..., result_json: _Optional[str] = ..., error_class: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...

class CompleteToolCallResponse(_message.Message):
    __slots__ = ("version", "status", "replayed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    version: int
    status: _common_pb2.RunStatus
    replayed: bool
    def __init__(self, version: _Optional[int] = ..., status: _Optional[_Union[_common_pb2.RunStatus, str]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class NextToolCall(_message.Message):
    __slots__ = ("step_key", "tool_name", "idempotency_key", "request_json", "execution_id", "event_id")
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    step_key: str
    tool_name: str
    idempotency_key: str
    request_json: str
    execution_id: str
    event_id: str
    def __init__(self, step_key: _Optional[str] = ..., tool_name: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., request_json: _Optional[str] = ..., execution_id: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...

class CompleteAndBeginToolCallRequest(_message.Message):
    __slots__ = ("lease", "expected_version", "step_key", "outcome", "response_json", "remote_resource_id", "error_code", "state_json", "schema_version", "evidence_json", "event_id", "next", "journal")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_JSON_FIELD_NUMBER: _ClassVar[int]
    REMOTE_RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    expected_version: int
    step_key: str
    outcome: ToolOutcome
    response_json: str
    remote_resource_id: str
    error_code: str
    state_json: str
    schema_version: int
    evidence_json: str
    event_id: str
    next: NextToolCall
    journal: _containers.RepeatedCompositeFieldContainer[_common_pb2.JournalEntry]
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., expected_version: _Optional[int] = ..., step_key: _Optional[str] = ..., outcome: _Optional[_Union[ToolOutcome, str]] = ..., response_json: _Optional[str] = ..., remote_resource_id: _Optional[str] = ..., error_code: _Optional[str] = ..., state_json: _Optional[str] = ..., schema_version: _Optional[int] = ..., evidence_json: _Optional[str] = ..., event_id: _Optional[str] = ..., next: _Optional[_Union[NextToolCall, _Mapping]] = ..., journal: _Optional[_Iterable[_Union[_common_pb2.JournalEntry, _Mapping]]] = ...) -> None: ...

class CompleteAndBeginToolCallResponse(_message.Message):
    __slots__ = ("version", "status", "execution", "replayed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    version: int
    status: _common_pb2.RunStatus
    execution: _common_pb2.ToolExecution
    replayed: bool
    def __init__(self, version: _Optional[int] = ..., status: _Optional[_Union[_common_pb2.RunStatus, str]] = ..., execution: _Optional[_Union[_common_pb2.ToolExecution, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class MarkToolInDoubtRequest(_message.Message):
    __slots__ = ("lease", "step_key", "error_code", "detail", "event_id")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    step_key: str
    error_code: str
    detail: str
    event_id: str
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., step_key: _Optional[str] = ..., error_code: _Optional[str] = ..., detail: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...

class MarkToolInDoubtResponse(_message.Message):
    __slots__ = ("status", "replayed")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.RunStatus
    replayed: bool
    def __init__(self, status: _Optional[_Union[_common_pb2.RunStatus, str]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class FinishRunRequest(_message.Message):
    __slots__ = ("lease", "expected_version", "outcome", "reason", "result_json", "sleep_ms", "pause_when_exhausted", "event_id", "error_class", "wait_signal", "signals_seen", "wait_children")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    SLEEP_MS_FIELD_NUMBER: _ClassVar[int]
    PAUSE_WHEN_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_SEEN_FIELD_NUMBER: _ClassVar[int]
    WAIT_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    expected_version: int
    outcome: FinishOutcome
    reason: str
    result_json: str
    sleep_ms: int
    pause_when_exhausted: bool
    event_id: str
    error_class: str
    wait_signal: str
    signals_seen: int
    wait_children: bool
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., expected_version: _Optional[int] = ..., outcome: _Optional[_Union[FinishOutcome, str]] = ..., reason: _Optional[str] = ..., result_json: _Optional[str] = ..., sleep_ms: _Optional[int] = ..., pause_when_exhausted: _Optional[bool] = ..., event_id: _Optional[str] = ..., error_class: _Optional[str] = ..., wait_signal: _Optional[str] = ..., signals_seen: _Optional[int] = ..., wait_children: _Optional[bool] = ...) -> None: ...

class ChildSpec(_message.Message):
    __slots__ = ("agent_name", "agent_version", "input_json", "labels", "budget")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    agent_version: str
    input_json: str
    labels: _containers.ScalarMap[str, str]
    budget: _common_pb2.Budget
    def __init__(self, agent_name: _Optional[str] = ..., agent_version: _Optional[str] = ..., input_json: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., budget: _Optional[_Union[_common_pb2.Budget, _Mapping]] = ...) -> None: ...

class SpawnChildrenRequest(_message.Message):
    __slots__ = ("lease", "spawn_key", "children", "join", "detach")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    SPAWN_KEY_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    DETACH_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    spawn_key: str
    children: _containers.RepeatedCompositeFieldContainer[ChildSpec]
    join: JoinMode
    detach: bool
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., spawn_key: _Optional[str] = ..., children: _Optional[_Iterable[_Union[ChildSpec, _Mapping]]] = ..., join: _Optional[_Union[JoinMode, str]] = ..., detach: _Optional[bool] = ...) -> None: ...

class ChildRun(_message.Message):
    __slots__ = ("index", "run_id", "agent_name", "status", "result_json", "error", "cost_usd")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    index: int
    run_id: str
    agent_name: str
    status: _common_pb2.RunStatus
    result_json: str
    error: str
    cost_usd: float
    def __init__(self, index: _Optional[int] = ..., run_id: _Optional[str] = ..., agent_name: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.RunStatus, str]] = ..., result_json: _Optional[str] = ..., error: _Optional[str] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class SpawnChildrenResponse(_message.Message):
    __slots__ = ("children", "created", "join_met")
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    JOIN_MET_FIELD_NUMBER: _ClassVar[int]
    children: _containers.RepeatedCompositeFieldContainer[ChildRun]
    created: int
    join_met: bool
    def __init__(self, children: _Optional[_Iterable[_Union[ChildRun, _Mapping]]] = ..., created: _Optional[int] = ..., join_met: _Optional[bool] = ...) -> None: ...

class FinishRunResponse(_message.Message):
    __slots__ = ("status", "next_attempt_at", "replayed")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.RunStatus
    next_attempt_at: _timestamp_pb2.Timestamp
    replayed: bool
    def __init__(self, status: _Optional[_Union[_common_pb2.RunStatus, str]] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class WriteBatchItem(_message.Message):
    __slots__ = ("heartbeat", "save_checkpoint", "begin_tool_call", "complete_tool_call", "complete_and_begin_tool_call", "mark_tool_in_doubt", "finish_run", "traceparent", "tracestate")
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SAVE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_AND_BEGIN_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    MARK_TOOL_IN_DOUBT_FIELD_NUMBER: _ClassVar[int]
    FINISH_RUN_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    heartbeat: HeartbeatRequest
    save_checkpoint: SaveCheckpointRequest
    begin_tool_call: BeginToolCallRequest
    complete_tool_call: CompleteToolCallRequest
    complete_and_begin_tool_call: CompleteAndBeginToolCallRequest
    mark_tool_in_doubt: MarkToolInDoubtRequest
    finish_run: FinishRunRequest
    traceparent: str
    tracestate: str
    def __init__(self, heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., save_checkpoint: _Optional[_Union[SaveCheckpointRequest, _Mapping]] = ..., begin_tool_call: _Optional[_Union[BeginToolCallRequest, _Mapping]] = ..., complete_tool_call: _Optional[_Union[CompleteToolCallRequest, _Mapping]] = ..., complete_and_begin_tool_call: _Optional[_Union[CompleteAndBeginToolCallRequest, _Mapping]] = ..., mark_tool_in_doubt: _Optional[_Union[MarkToolInDoubtRequest, _Mapping]] = ..., finish_run: _Optional[_Union[FinishRunRequest, _Mapping]] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class WriteBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[WriteBatchItem]
    def __init__(self, items: _Optional[_Iterable[_Union[WriteBatchItem, _Mapping]]] = ...) -> None: ...

class WriteBatchError(_message.Message):
    __slots__ = ("code", "message", "reason", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WriteBatchResult(_message.Message):
    __slots__ = ("error", "heartbeat", "save_checkpoint", "begin_tool_call", "complete_tool_call", "complete_and_begin_tool_call", "mark_tool_in_doubt", "finish_run")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SAVE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_AND_BEGIN_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    MARK_TOOL_IN_DOUBT_FIELD_NUMBER: _ClassVar[int]
    FINISH_RUN_FIELD_NUMBER: _ClassVar[int]
    error: WriteBatchError
    heartbeat: HeartbeatResponse
    save_checkpoint: SaveCheckpointResponse
    begin_tool_call: BeginToolCallResponse
    complete_tool_call: CompleteToolCallResponse
    complete_and_begin_tool_call: CompleteAndBeginToolCallResponse
    mark_tool_in_doubt: MarkToolInDoubtResponse
    finish_run: FinishRunResponse
    def __init__(self, error: _Optional[_Union[WriteBatchError, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatResponse, _Mapping]] = ..., save_checkpoint: _Optional[_Union[SaveCheckpointResponse, _Mapping]] = ..., begin_tool_call: _Optional[_Union[BeginToolCallResponse, _Mapping]] = ..., complete_tool_call: _Optional[_Union[CompleteToolCallResponse, _Mapping]] = ..., complete_and_begin_tool_call: _Optional[_Union[CompleteAndBeginToolCallResponse, _Mapping]] = ..., mark_tool_in_doubt: _Optional[_Union[MarkToolInDoubtResponse, _Mapping]] = ..., finish_run: _Optional[_Union[FinishRunResponse, _Mapping]] = ...) -> None: ...

class WriteBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[WriteBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[WriteBatchResult, _Mapping]]] = ...) -> None: ...

class ReadJournalRequest(_message.Message):
    __slots__ = ("lease", "after_seq", "page_size", "compact")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPACT_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    after_seq: int
    page_size: int
    compact: bool
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., after_seq: _Optional[int] = ..., page_size: _Optional[int] = ..., compact: _Optional[bool] = ...) -> None: ...

class ReadJournalResponse(_message.Message):
    __slots__ = ("entries", "more", "entries_json")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_JSON_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_common_pb2.JournalEntry]
    more: bool
    entries_json: str
    def __init__(self, entries: _Optional[_Iterable[_Union[_common_pb2.JournalEntry, _Mapping]]] = ..., more: _Optional[bool] = ..., entries_json: _Optional[str] = ...) -> None: ...

class GetToolResultsRequest(_message.Message):
    __slots__ = ("lease", "step_keys")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    STEP_KEYS_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    step_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., step_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class GetToolResultsResponse(_message.Message):
    __slots__ = ("executions",)
    EXECUTIONS_FIELD_NUMBER: _ClassVar[int]
    executions: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolExecution]
    def __init__(self, executions: _Optional[_Iterable[_Union[_common_pb2.ToolExecution, _Mapping]]] = ...) -> None: ...

class AgentRegistration(_message.Message):
    __slots__ = ("name", "version", "input_schema_json", "tool_names", "default_priority", "concurrency_key", "concurrency_max", "sensitive_json", "signals_json", "resume_input_schema_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_MAX_FIELD_NUMBER: _ClassVar[int]
    SENSITIVE_JSON_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESUME_INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    input_schema_json: str
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    default_priority: int
    concurrency_key: str
    concurrency_max: int
    sensitive_json: str
    signals_json: str
    resume_input_schema_json: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., tool_names: _Optional[_Iterable[str]] = ..., default_priority: _Optional[int] = ..., concurrency_key: _Optional[str] = ..., concurrency_max: _Optional[int] = ..., sensitive_json: _Optional[str] = ..., signals_json: _Optional[str] = ..., resume_input_schema_json: _Optional[str] = ...) -> None: ...

class RegisterAgentsRequest(_message.Message):
    __slots__ = ("worker_id", "agents", "ttl_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    agents: _containers.RepeatedCompositeFieldContainer[AgentRegistration]
    ttl_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., agents: _Optional[_Iterable[_Union[AgentRegistration, _Mapping]]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class RegisterAgentsResponse(_message.Message):
    __slots__ = ("expires_at",)
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
