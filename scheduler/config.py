"""The scheduler's settings (section `scheduler:` of the config file, env prefix AGENTRT_)
and the per-field payload limits they resolve to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field, SecretStr, model_validator

from shared.config import ComponentSettings


class SchedulerSettings(ComponentSettings):
    section: ClassVar[str] = "scheduler"

    database_url: str = "postgresql://postgres@127.0.0.1:5432/agentrt"
    listen_addr: str = "0.0.0.0:50051"
    lease_duration_ms: int = Field(30_000, ge=1_000, le=3_600_000)
    # Advised to executors with each lease; unset = a third of the lease duration.
    heartbeat_interval_ms: int | None = Field(None, ge=100)
    backoff_base_ms: int = Field(1_000, ge=1)
    backoff_cap_ms: int = Field(300_000, ge=1)
    backoff_jitter_ms: int = Field(1_000, ge=0)
    default_max_attempts: int = Field(12, ge=1, le=1_000)
    max_payload_bytes: int = Field(1_048_576, ge=1_024)
    # Per-field limits (bytes of JSON text of one field of one call, never of a whole run); unset =
    # max_payload_bytes. Executors learn them with each lease (Lease.limits).
    max_tool_request_bytes: int | None = Field(None, ge=1_024)  # BeginToolCall / next.request_json
    max_tool_response_bytes: int | None = Field(None, ge=1_024)  # response_json of a tool's outcome
    max_checkpoint_bytes: int | None = Field(None, ge=1_024)  # every state_json
    # One journal entry's detail_json; unset = 64 KiB (max_payload_bytes when smaller).
    max_journal_entry_bytes: int | None = Field(None, ge=256)
    # Checkpoint versions kept per run; older (superseded) ones are deleted in the background.
    # 0 = keep every version (the default).
    checkpoint_keep_last: int = Field(0, ge=0)
    checkpoint_prune_interval_s: float = Field(30.0, gt=0)
    checkpoint_prune_batch_runs: int = Field(500, ge=1, le=100_000)  # runs looked at per statement
    claim_poll_interval_ms: int = Field(500, ge=10)
    max_claim_wait_ms: int = Field(30_000, ge=0)
    db_pool_min: int = Field(2, ge=1)
    db_pool_max: int = Field(20, ge=1)
    db_command_timeout_s: float = Field(30.0, gt=0)
    shutdown_grace_s: float = Field(10.0, ge=0)
    # Tracing of each SQL statement (asyncpg instrumentation): off by default for speed.
    trace_sql: bool = False
    # SubmitRun refuses an agent (or version) that no live executor has registered (AGENT_NOT_REGISTERED)
    # unless the submit sets allow_unregistered; false admits every agent (inputs are still checked
    # against the schema of a registered version).
    require_registered_agents: bool = True
    # Executors must present this token on WorkService calls (`authorization: Bearer …`).
    # Unset = WorkService open to anyone who reaches the port: development only.
    work_token: SecretStr | None = None

    @model_validator(mode="after")
    def _heartbeat_fits_the_lease(self) -> SchedulerSettings:
        if self.heartbeat_interval_ms is None:
            self.heartbeat_interval_ms = self.lease_duration_ms // 3
        if self.heartbeat_interval_ms * 3 > self.lease_duration_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of lease_duration_ms")
        if self.backoff_cap_ms < self.backoff_base_ms:
            raise ValueError("backoff_cap_ms must not be below backoff_base_ms")
        for name in ("max_tool_request_bytes", "max_tool_response_bytes", "max_checkpoint_bytes"):
            if getattr(self, name) is None:
                setattr(self, name, self.max_payload_bytes)
        if self.max_journal_entry_bytes is None:
            self.max_journal_entry_bytes = min(DEFAULT_MAX_JOURNAL_ENTRY_BYTES, self.max_payload_bytes)
        return self

    @property
    def limits(self) -> PayloadLimits:
        """The per-field size limits, every one resolved (the validator fills the unset ones)."""
        return PayloadLimits(
            tool_request=self.max_tool_request_bytes or self.max_payload_bytes,
            tool_response=self.max_tool_response_bytes or self.max_payload_bytes,
            checkpoint=self.max_checkpoint_bytes or self.max_payload_bytes,
            journal_entry=self.max_journal_entry_bytes or DEFAULT_MAX_JOURNAL_ENTRY_BYTES,
            payload=self.max_payload_bytes,
        )


DEFAULT_MAX_JOURNAL_ENTRY_BYTES = 65_536


@dataclass(frozen=True)
class PayloadLimits:
    """Largest JSON text accepted per field (bytes), by kind of field."""

    tool_request: int
    tool_response: int
    checkpoint: int
    journal_entry: int
    payload: int  # every other JSON field
