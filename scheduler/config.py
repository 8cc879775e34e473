"""The scheduler's settings (section `scheduler:` of the config file, env prefix AGENTRT_)
and the per-field payload limits they resolve to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field, SecretStr, model_validator

from scheduler.roles import parse_auth_mode
from shared.config import ComponentSettings
from shared.transport import ServerTls


class SchedulerSettings(ComponentSettings):
    section: ClassVar[str] = "scheduler"
    service_name: str = "agentrt-scheduler"
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
    # How often each replica looks for due schedules (0 = this replica fires none).
    schedule_poll_interval_ms: int = Field(500, ge=0)
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
    # Executors must present this token on WorkService calls (`authorization: Bearer …`), or a
    # client certificate named in work_client_identities. Neither = WorkService open to anyone
    # who reaches the port: development only.
    work_token: SecretStr | None = None
    # mTLS client identities (certificate CN or DNS SAN) allowed on WorkService without the token.
    work_client_identities: list[str] = Field(default_factory=list)
    # With authentication on, the scheduler refuses to start with WorkService open (no token, no
    # identities): it hands out every tenant's runs. true = open on purpose (a closed network).
    work_service_open: bool = False
    # How RunService callers authenticate: api_key, jwt, api_key,jwt, or none (every caller may act
    # for any tenant named in x-tenant-id: development only, logged as a warning at start).
    auth_mode: str = "api_key"
    # A revoked key stops working on every replica within this time (lookups are cached).
    api_key_cache_ttl_ms: int = Field(2_000, ge=0, le=60_000)
    # OIDC / JWT bearer tokens (auth_mode jwt): keys from a JWKS file or URL (fetched, cached,
    # refetched on an unknown kid at most every 10 s); issuer and audience must match.
    jwt_jwks_file: str | None = None
    jwt_jwks_url: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"])
    jwt_tenant_claim: str = "tenant"  # a string or a list of tenants
    jwt_roles_claim: str = "roles"  # a string or a list; a dotted path reaches into objects
    jwt_jwks_refresh_s: float = Field(300.0, gt=0)
    jwt_leeway_s: float = Field(30.0, ge=0, le=600)
    # TLS on the gRPC port (PEM files, read again when they change on disk). A client CA turns
    # on mutual TLS: every client must present a certificate it signed.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None

    @model_validator(mode="after")
    def _heartbeat_fits_the_lease(self) -> SchedulerSettings:
        if self.heartbeat_interval_ms is None:
            self.heartbeat_interval_ms = self.lease_duration_ms // 3
        if self.heartbeat_interval_ms * 3 > self.lease_duration_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of lease_duration_ms")
        modes = parse_auth_mode(self.auth_mode)
        if "jwt" in modes and not (self.jwt_issuer and self.jwt_audience
                                   and bool(self.jwt_jwks_file) != bool(self.jwt_jwks_url)):
            raise ValueError("auth_mode jwt needs jwt_issuer, jwt_audience and one of jwt_jwks_file, jwt_jwks_url")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
        if self.work_client_identities and not self.tls_client_ca_file:
            raise ValueError("work_client_identities needs mutual TLS (tls_client_ca_file)")
        if self.backoff_cap_ms < self.backoff_base_ms:
            raise ValueError("backoff_cap_ms must not be below backoff_base_ms")
        for name in ("max_tool_request_bytes", "max_tool_response_bytes", "max_checkpoint_bytes"):
            if getattr(self, name) is None:
                setattr(self, name, self.max_payload_bytes)
        if self.max_journal_entry_bytes is None:
            self.max_journal_entry_bytes = min(DEFAULT_MAX_JOURNAL_ENTRY_BYTES, self.max_payload_bytes)
        return self

    def refuse_open_work_service(self) -> None:
        """Checked when a scheduler starts (not by `agentrt migrate`, which serves nothing)."""
        if "none" not in parse_auth_mode(self.auth_mode) and not (
                self.work_token or self.work_client_identities or self.work_service_open):
            raise ValueError("WorkService would be open to anyone who reaches the port (it hands out every "
                             "tenant's runs): set work_token or work_client_identities, or work_service_open: true")

    @property
    def server_tls(self) -> ServerTls | None:
        if not (self.tls_cert_file and self.tls_key_file):
            return None
        return ServerTls(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)

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
