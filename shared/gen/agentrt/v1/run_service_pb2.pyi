import datetime

from shared.gen.agentrt.v1 import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScheduleOverlap(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEDULE_OVERLAP_UNSPECIFIED: _ClassVar[ScheduleOverlap]
    SCHEDULE_OVERLAP_SKIP: _ClassVar[ScheduleOverlap]
    SCHEDULE_OVERLAP_BUFFER_ONE: _ClassVar[ScheduleOverlap]
    SCHEDULE_OVERLAP_ALLOW_ALL: _ClassVar[ScheduleOverlap]

class ResumeDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESUME_DECISION_UNSPECIFIED: _ClassVar[ResumeDecision]
    RESUME_DECISION_APPROVE: _ClassVar[ResumeDecision]
    RESUME_DECISION_REJECT: _ClassVar[ResumeDecision]
    RESUME_DECISION_INPUT: _ClassVar[ResumeDecision]

class ResolutionOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOLUTION_OUTCOME_UNSPECIFIED: _ClassVar[ResolutionOutcome]
    RESOLUTION_OUTCOME_SUCCEEDED: _ClassVar[ResolutionOutcome]
    RESOLUTION_OUTCOME_NOT_EXECUTED: _ClassVar[ResolutionOutcome]
    RESOLUTION_OUTCOME_UNKNOWN: _ClassVar[ResolutionOutcome]

class HistoryPart(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HISTORY_PART_UNSPECIFIED: _ClassVar[HistoryPart]
    HISTORY_PART_CHECKPOINTS: _ClassVar[HistoryPart]
    HISTORY_PART_TOOL_EXECUTIONS: _ClassVar[HistoryPart]
    HISTORY_PART_EVENTS: _ClassVar[HistoryPart]
    HISTORY_PART_JOURNAL: _ClassVar[HistoryPart]

class ApiKeyRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    API_KEY_ROLE_UNSPECIFIED: _ClassVar[ApiKeyRole]
    API_KEY_ROLE_VIEWER: _ClassVar[ApiKeyRole]
    API_KEY_ROLE_SUBMITTER: _ClassVar[ApiKeyRole]
    API_KEY_ROLE_OPERATOR: _ClassVar[ApiKeyRole]
    API_KEY_ROLE_ADMIN: _ClassVar[ApiKeyRole]
SCHEDULE_OVERLAP_UNSPECIFIED: ScheduleOverlap
SCHEDULE_OVERLAP_SKIP: ScheduleOverlap
SCHEDULE_OVERLAP_BUFFER_ONE: ScheduleOverlap
SCHEDULE_OVERLAP_ALLOW_ALL: ScheduleOverlap
RESUME_DECISION_UNSPECIFIED: ResumeDecision
RESUME_DECISION_APPROVE: ResumeDecision
RESUME_DECISION_REJECT: ResumeDecision
RESUME_DECISION_INPUT: ResumeDecision
RESOLUTION_OUTCOME_UNSPECIFIED: ResolutionOutcome
RESOLUTION_OUTCOME_SUCCEEDED: ResolutionOutcome
RESOLUTION_OUTCOME_NOT_EXECUTED: ResolutionOutcome
RESOLUTION_OUTCOME_UNKNOWN: ResolutionOutcome
HISTORY_PART_UNSPECIFIED: HistoryPart
HISTORY_PART_CHECKPOINTS: HistoryPart
HISTORY_PART_TOOL_EXECUTIONS: HistoryPart
HISTORY_PART_EVENTS: HistoryPart
HISTORY_PART_JOURNAL: HistoryPart
API_KEY_ROLE_UNSPECIFIED: ApiKeyRole
API_KEY_ROLE_VIEWER: ApiKeyRole
API_KEY_ROLE_SUBMITTER: ApiKeyRole
API_KEY_ROLE_OPERATOR: ApiKeyRole
API_KEY_ROLE_ADMIN: ApiKeyRole

class AuditNote(_message.Message):
    __slots__ = ("reason", "comment", "ticket_id")
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    reason: str
    comment: str
    ticket_id: str
    def __init__(self, reason: _Optional[str] = ..., comment: _Optional[str] = ..., ticket_id: _Optional[str] = ...) -> None: ...

class SubmitRunRequest(_message.Message):
    __slots__ = ("agent_name", "agent_version", "input_json", "client_request_id", "max_attempts", "budget", "labels", "allow_unregistered", "priority")
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
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_UNREGISTERED_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    agent_version: str
    input_json: str
    client_request_id: str
    max_attempts: int
    budget: _common_pb2.Budget
    labels: _containers.ScalarMap[str, str]
    allow_unregistered: bool
    priority: int
    def __init__(self, agent_name: _Optional[str] = ..., agent_version: _Optional[str] = ..., input_json: _Optional[str] = ..., client_request_id: _Optional[str] = ..., max_attempts: _Optional[int] = ..., budget: _Optional[_Union[_common_pb2.Budget, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., allow_unregistered: _Optional[bool] = ..., priority: _Optional[int] = ...) -> None: ...

class SubmitRunResponse(_message.Message):
    __slots__ = ("run", "created")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    created: bool
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id", "reveal", "note")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REVEAL_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reveal: bool
    note: AuditNote
    def __init__(self, run_id: _Optional[str] = ..., reveal: _Optional[bool] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("statuses", "agent_name", "page_size", "page_token", "labels", "min_priority", "max_priority", "tenant_id", "created_after", "created_before")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MIN_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[_common_pb2.RunStatus]
    agent_name: str
    page_size: int
    page_token: str
    labels: _containers.ScalarMap[str, str]
    min_priority: int
    max_priority: int
    tenant_id: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    def __init__(self, statuses: _Optional[_Iterable[_Union[_common_pb2.RunStatus, str]]] = ..., agent_name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., min_priority: _Optional[int] = ..., max_priority: _Optional[int] = ..., tenant_id: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_common_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason", "note", "request_id", "keep_children")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    note: AuditNote
    request_id: str
    keep_children: bool
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ..., request_id: _Optional[str] = ..., keep_children: _Optional[bool] = ...) -> None: ...

class RetryRunRequest(_message.Message):
    __slots__ = ("run_id", "request_id", "note")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    request_id: str
    note: AuditNote
    def __init__(self, run_id: _Optional[str] = ..., request_id: _Optional[str] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ...) -> None: ...

class RetryRunResponse(_message.Message):
    __slots__ = ("run", "created")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    created: bool
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class SignalRunRequest(_message.Message):
    __slots__ = ("run_id", "name", "payload_json", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    payload_json: str
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ..., payload_json: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SignalRunResponse(_message.Message):
    __slots__ = ("signal", "created", "run")
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    signal: _common_pb2.Signal
    created: bool
    run: _common_pb2.Run
    def __init__(self, signal: _Optional[_Union[_common_pb2.Signal, _Mapping]] = ..., created: _Optional[bool] = ..., run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class GetRunTreeRequest(_message.Message):
    __slots__ = ("run_id", "max_runs", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNS_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    max_runs: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., max_runs: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class RunTreeNode(_message.Message):
    __slots__ = ("run", "depth")
    RUN_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    depth: int
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., depth: _Optional[int] = ...) -> None: ...

class GetRunTreeResponse(_message.Message):
    __slots__ = ("nodes", "truncated", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[RunTreeNode]
    truncated: bool
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[RunTreeNode, _Mapping]]] = ..., truncated: _Optional[bool] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ScheduleSpec(_message.Message):
    __slots__ = ("agent_name", "agent_version", "input_json", "labels", "interval_ms", "cron", "time_zone", "overlap", "catch_up_window_ms", "jitter_ms")
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
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    JITTER_MS_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    agent_version: str
    input_json: str
    labels: _containers.ScalarMap[str, str]
    interval_ms: int
    cron: str
    time_zone: str
    overlap: ScheduleOverlap
    catch_up_window_ms: int
    jitter_ms: int
    def __init__(self, agent_name: _Optional[str] = ..., agent_version: _Optional[str] = ..., input_json: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., interval_ms: _Optional[int] = ..., cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., overlap: _Optional[_Union[ScheduleOverlap, str]] = ..., catch_up_window_ms: _Optional[int] = ..., jitter_ms: _Optional[int] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("schedule_id", "tenant_id", "name", "spec", "paused", "next_fire_at", "last_run_id", "last_fire_at", "fires", "skipped", "created_at")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    FIRES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    tenant_id: str
    name: str
    spec: ScheduleSpec
    paused: bool
    next_fire_at: _timestamp_pb2.Timestamp
    last_run_id: str
    last_fire_at: _timestamp_pb2.Timestamp
    fires: int
    skipped: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, schedule_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., name: _Optional[str] = ..., spec: _Optional[_Union[ScheduleSpec, _Mapping]] = ..., paused: _Optional[bool] = ..., next_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_run_id: _Optional[str] = ..., last_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fires: _Optional[int] = ..., skipped: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ("name", "spec", "request_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: ScheduleSpec
    request_id: str
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Union[ScheduleSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateScheduleResponse(_message.Message):
    __slots__ = ("schedule", "created")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    created: bool
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class UpdateScheduleRequest(_message.Message):
    __slots__ = ("schedule_id", "spec", "request_id")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    spec: ScheduleSpec
    request_id: str
    def __init__(self, schedule_id: _Optional[str] = ..., spec: _Optional[_Union[ScheduleSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class PauseScheduleRequest(_message.Message):
    __slots__ = ("schedule_id", "paused", "request_id")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    paused: bool
    request_id: str
    def __init__(self, schedule_id: _Optional[str] = ..., paused: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeleteScheduleRequest(_message.Message):
    __slots__ = ("schedule_id", "request_id")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    request_id: str
    def __init__(self, schedule_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules",)
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ...) -> None: ...

class ResumeRunRequest(_message.Message):
    __slots__ = ("run_id", "decision", "input_json", "operator", "comment", "note", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    decision: ResumeDecision
    input_json: str
    operator: str
    comment: str
    note: AuditNote
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., decision: _Optional[_Union[ResumeDecision, str]] = ..., input_json: _Optional[str] = ..., operator: _Optional[str] = ..., comment: _Optional[str] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResolveToolExecutionRequest(_message.Message):
    __slots__ = ("run_id", "step_key", "outcome", "result_json", "remote_resource_id", "evidence_json", "resolved_by", "rule_version", "event_id", "note", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    REMOTE_RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_BY_FIELD_NUMBER: _ClassVar[int]
    RULE_VERSION_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_key: str
    outcome: ResolutionOutcome
    result_json: str
    remote_resource_id: str
    evidence_json: str
    resolved_by: str
    rule_version: str
    event_id: str
    note: AuditNote
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., step_key: _Optional[str] = ..., outcome: _Optional[_Union[ResolutionOutcome, str]] = ..., result_json: _Optional[str] = ..., remote_resource_id: _Optional[str] = ..., evidence_json: _Optional[str] = ..., resolved_by: _Optional[str] = ..., rule_version: _Optional[str] = ..., event_id: _Optional[str] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResolveToolExecutionResponse(_message.Message):
    __slots__ = ("run", "execution")
    RUN_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    execution: _common_pb2.ToolExecution
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., execution: _Optional[_Union[_common_pb2.ToolExecution, _Mapping]] = ...) -> None: ...

class GetRunHistoryRequest(_message.Message):
    __slots__ = ("run_id", "page_size", "page_token", "include", "export", "note", "reveal")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    EXPORT_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REVEAL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_size: int
    page_token: str
    include: _containers.RepeatedScalarFieldContainer[HistoryPart]
    export: bool
    note: AuditNote
    reveal: bool
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include: _Optional[_Iterable[_Union[HistoryPart, str]]] = ..., export: _Optional[bool] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ..., reveal: _Optional[bool] = ...) -> None: ...

class RunHistory(_message.Message):
    __slots__ = ("run", "checkpoints", "tool_executions", "events", "next_page_token", "journal")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_EXECUTIONS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    checkpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.Checkpoint]
    tool_executions: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolExecution]
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.OutboxEvent]
    next_page_token: str
    journal: _containers.RepeatedCompositeFieldContainer[_common_pb2.JournalEntry]
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., checkpoints: _Optional[_Iterable[_Union[_common_pb2.Checkpoint, _Mapping]]] = ..., tool_executions: _Optional[_Iterable[_Union[_common_pb2.ToolExecution, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[_common_pb2.OutboxEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., journal: _Optional[_Iterable[_Union[_common_pb2.JournalEntry, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunStats(_message.Message):
    __slots__ = ("runs_by_status", "oldest_queued_age_s", "in_doubt_runs", "oldest_in_doubt_age_s", "outbox_pending", "outbox_oldest_pending_age_s", "database_time", "auth_mode", "principal", "role", "queued", "running", "waiting_on_limit", "limits", "server_version")
    class RunsByStatusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class WaitingOnLimitEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class LimitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUNS_BY_STATUS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_QUEUED_AGE_S_FIELD_NUMBER: _ClassVar[int]
    IN_DOUBT_RUNS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_IN_DOUBT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_PENDING_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_OLDEST_PENDING_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DATABASE_TIME_FIELD_NUMBER: _ClassVar[int]
    AUTH_MODE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_ON_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    runs_by_status: _containers.ScalarMap[str, int]
    oldest_queued_age_s: float
    in_doubt_runs: int
    oldest_in_doubt_age_s: float
    outbox_pending: int
    outbox_oldest_pending_age_s: float
    database_time: _timestamp_pb2.Timestamp
    auth_mode: str
    principal: str
    role: str
    queued: int
    running: int
    waiting_on_limit: _containers.ScalarMap[str, int]
    limits: _containers.ScalarMap[str, str]
    server_version: str
    def __init__(self, runs_by_status: _Optional[_Mapping[str, int]] = ..., oldest_queued_age_s: _Optional[float] = ..., in_doubt_runs: _Optional[int] = ..., oldest_in_doubt_age_s: _Optional[float] = ..., outbox_pending: _Optional[int] = ..., outbox_oldest_pending_age_s: _Optional[float] = ..., database_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., auth_mode: _Optional[str] = ..., principal: _Optional[str] = ..., role: _Optional[str] = ..., queued: _Optional[int] = ..., running: _Optional[int] = ..., waiting_on_limit: _Optional[_Mapping[str, int]] = ..., limits: _Optional[_Mapping[str, str]] = ..., server_version: _Optional[str] = ...) -> None: ...

class ListAgentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisteredAgent(_message.Message):
    __slots__ = ("name", "version", "input_schema_json", "tool_names", "executors", "last_seen")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    input_schema_json: str
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    executors: _containers.RepeatedScalarFieldContainer[str]
    last_seen: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., tool_names: _Optional[_Iterable[str]] = ..., executors: _Optional[_Iterable[str]] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListAgentsResponse(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[RegisteredAgent]
    def __init__(self, agents: _Optional[_Iterable[_Union[RegisteredAgent, _Mapping]]] = ...) -> None: ...

class ListAuditEventsRequest(_message.Message):
    __slots__ = ("run_id", "principal", "action", "since", "until", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    principal: str
    action: str
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., principal: _Optional[str] = ..., action: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("audit_id", "at", "principal", "principal_kind", "tenant_id", "action", "run_id", "step_key", "reason", "comment", "ticket_id", "state_before_json", "state_after_json", "evidence_json", "request_id")
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_KIND_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_BEFORE_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_AFTER_JSON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    at: _timestamp_pb2.Timestamp
    principal: str
    principal_kind: str
    tenant_id: str
    action: str
    run_id: str
    step_key: str
    reason: str
    comment: str
    ticket_id: str
    state_before_json: str
    state_after_json: str
    evidence_json: str
    request_id: str
    def __init__(self, audit_id: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., principal: _Optional[str] = ..., principal_kind: _Optional[str] = ..., tenant_id: _Optional[str] = ..., action: _Optional[str] = ..., run_id: _Optional[str] = ..., step_key: _Optional[str] = ..., reason: _Optional[str] = ..., comment: _Optional[str] = ..., ticket_id: _Optional[str] = ..., state_before_json: _Optional[str] = ..., state_after_json: _Optional[str] = ..., evidence_json: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListAuditEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ApiKey(_message.Message):
    __slots__ = ("key_id", "name", "tenants", "role", "created_by", "created_at", "expires_at", "revoked_at")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    name: str
    tenants: _containers.RepeatedScalarFieldContainer[str]
    role: ApiKeyRole
    created_by: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    def __init__(self, key_id: _Optional[str] = ..., name: _Optional[str] = ..., tenants: _Optional[_Iterable[str]] = ..., role: _Optional[_Union[ApiKeyRole, str]] = ..., created_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateApiKeyRequest(_message.Message):
    __slots__ = ("name", "tenants", "role", "expires_in_s", "note", "request_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenants: _containers.RepeatedScalarFieldContainer[str]
    role: ApiKeyRole
    expires_in_s: int
    note: AuditNote
    request_id: str
    def __init__(self, name: _Optional[str] = ..., tenants: _Optional[_Iterable[str]] = ..., role: _Optional[_Union[ApiKeyRole, str]] = ..., expires_in_s: _Optional[int] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateApiKeyResponse(_message.Message):
    __slots__ = ("key", "secret")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    key: ApiKey
    secret: str
    def __init__(self, key: _Optional[_Union[ApiKey, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListApiKeysRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "include_revoked")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    include_revoked: bool
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_revoked: _Optional[bool] = ...) -> None: ...

class ListApiKeysResponse(_message.Message):
    __slots__ = ("keys", "next_page_token")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ApiKey]
    next_page_token: str
    def __init__(self, keys: _Optional[_Iterable[_Union[ApiKey, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RevokeApiKeyRequest(_message.Message):
    __slots__ = ("key_id", "note", "request_id")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    note: AuditNote
    request_id: str
    def __init__(self, key_id: _Optional[str] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class FlowLimit(_message.Message):
    __slots__ = ("scope", "tenant_id", "subject", "name", "value", "updated_at", "updated_by")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    scope: str
    tenant_id: str
    subject: str
    name: str
    value: str
    updated_at: _timestamp_pb2.Timestamp
    updated_by: str
    def __init__(self, scope: _Optional[str] = ..., tenant_id: _Optional[str] = ..., subject: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_by: _Optional[str] = ...) -> None: ...

class SetLimitRequest(_message.Message):
    __slots__ = ("scope", "tenant_id", "subject", "name", "value", "note", "request_id")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    scope: str
    tenant_id: str
    subject: str
    name: str
    value: str
    note: AuditNote
    request_id: str
    def __init__(self, scope: _Optional[str] = ..., tenant_id: _Optional[str] = ..., subject: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[str] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClearLimitRequest(_message.Message):
    __slots__ = ("scope", "tenant_id", "subject", "name", "note", "request_id")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    scope: str
    tenant_id: str
    subject: str
    name: str
    note: AuditNote
    request_id: str
    def __init__(self, scope: _Optional[str] = ..., tenant_id: _Optional[str] = ..., subject: _Optional[str] = ..., name: _Optional[str] = ..., note: _Optional[_Union[AuditNote, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClearLimitResponse(_message.Message):
    __slots__ = ("cleared", "limit")
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    cleared: bool
    limit: FlowLimit
    def __init__(self, cleared: _Optional[bool] = ..., limit: _Optional[_Union[FlowLimit, _Mapping]] = ...) -> None: ...

class ListLimitsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLimitsResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[FlowLimit]
    def __init__(self, limits: _Optional[_Iterable[_Union[FlowLimit, _Mapping]]] = ...) -> None: ...
