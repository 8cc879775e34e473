"""The scheduler's settings (section `scheduler:` of the config file, env prefix AGENTRT_)
and the per-field payload limits they resolve to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from scheduler.bounds import MAX_COUNT, MAX_PAYLOAD_BYTES, MAX_WAIT_MS, MAX_WEIGHT, MIN_WEIGHT
from scheduler.security.rbac import parse_auth_mode
from shared.config import ComponentSettings
from shared.transport import ServerTls


class TenantLimits(BaseModel):
    """One tenant's overrides of the per-tenant limits (unset: the scheduler-wide setting)."""

    model_config = ConfigDict(extra="forbid")
    max_queued_runs: int | None = Field(None, ge=0, le=MAX_COUNT)  # 0 = no limit
    max_submits_per_s: int | None = Field(None, ge=0, le=MAX_COUNT)  # 0 = no limit
    max_running: int | None = Field(None, ge=0, le=MAX_COUNT)  # 0 = no limit
    # Fair-share weight (unset: 1).
    weight: float | None = Field(None, ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)


_RATE_UNITS = {"s": 1_000, "sec": 1_000, "second": 1_000, "min": 60_000, "minute": 60_000, "h": 3_600_000,
               "hour": 3_600_000}


class ToolLimit(BaseModel):
    """A tool's limits over every executor: `rate` calls per window ("100/min", "5/s", "1000/h") by the
    ledger's intent times, and `concurrency` calls open at once (intent recorded, outcome not yet)."""

    model_config = ConfigDict(extra="forbid")
    rate: str | None = None
    concurrency: int | None = Field(None, ge=1, le=MAX_COUNT)

    @field_validator("rate")
    @classmethod
    def _rate_form(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rate(value)
        return value

    @property
    def rate_per_window(self) -> tuple[int, int]:
        """(calls, window ms); (0, 0) without a rate."""
        return parse_rate(self.rate) if self.rate else (0, 0)


def parse_rate(text: str) -> tuple[int, int]:
    """(calls, window ms). The calls are a LIMIT of the tool_usage query (bigint): at most MAX_COUNT."""
    count, _, unit = text.replace(" ", "").partition("/")
    if not (count.isascii() and count.isdigit()) or not 1 <= int(count) <= MAX_COUNT or unit not in _RATE_UNITS:
        raise ValueError(f"rate {text[:60]!r}: 1 to {MAX_COUNT} calls per window (s, min or h), "
                         "e.g. 100/min, 5/s or 1000/h")
    return int(count), _RATE_UNITS[unit]


class AgentLimits(BaseModel):
    """One agent's limits (every tenant's runs of it together)."""

    model_config = ConfigDict(extra="forbid")
    max_running: int = Field(0, ge=0, le=MAX_COUNT)  # 0 = no limit


@dataclass(frozen=True)
class ConcurrencyLimits:
    """The tenant and agent concurrency limits as claim_work takes them (parallel arrays; 0 = none)."""

    tenant_max_default: int
    tenants: list[str]
    tenant_max: list[int]
    agents: list[str]
    agent_max: list[int]

    @property
    def active(self) -> bool:
        return bool(self.tenant_max_default or any(self.tenant_max) or any(self.agent_max))

    def params(self) -> dict[str, object]:
        return {"tenant_max_default": self.tenant_max_default, "limit_tenants": self.tenants,
                "limit_tenant_max": self.tenant_max, "limit_agents": self.agents, "limit_agent_max": self.agent_max}

    def of_tenant(self, tenant: str) -> int:
        return dict(zip(self.tenants, self.tenant_max, strict=True)).get(tenant, self.tenant_max_default)

    def of_agent(self, agent: str) -> int:
        return dict(zip(self.agents, self.agent_max, strict=True)).get(agent, 0)


@dataclass(frozen=True)
class SubmitQuota:
    """A tenant's submit quotas, resolved (0 = no limit)."""

    max_queued_runs: int
    max_submits_per_s: int

    @property
    def active(self) -> bool:
        return bool(self.max_queued_runs or self.max_submits_per_s)


class SchedulerSettings(ComponentSettings):
    section: ClassVar[str] = "scheduler"
    service_name: str = "agentrt-scheduler"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/agentrt"
    listen_addr: str = "0.0.0.0:50051"
    lease_duration_ms: int = Field(30_000, ge=1_000, le=3_600_000)
    # Advised to executors with each lease; unset = a third of the lease duration.
    heartbeat_interval_ms: int | None = Field(None, ge=100, le=1_200_000)
    backoff_base_ms: int = Field(1_000, ge=1, le=MAX_WAIT_MS)
    backoff_cap_ms: int = Field(300_000, ge=1, le=MAX_WAIT_MS)
    backoff_jitter_ms: int = Field(1_000, ge=0, le=MAX_WAIT_MS)
    default_max_attempts: int = Field(12, ge=1, le=1_000)
    # Priority of a run submitted without one whose agent definition sets none: 1 (lowest) .. 9.
    default_priority: int = Field(5, ge=1, le=9)
    # Per-tenant quotas on SubmitRun (0 = no limit): QUEUED runs at once, and submits in any one-second
    # window (database time). Over either: RESOURCE_EXHAUSTED with RetryInfo, nothing written.
    max_queued_runs_per_tenant: int = Field(0, ge=0, le=MAX_COUNT)
    max_submits_per_s_per_tenant: int = Field(0, ge=0, le=MAX_COUNT)
    # The RetryInfo delay of a submit refused because the tenant's queue is full.
    queue_full_retry_after_ms: int = Field(1_000, ge=1, le=3_600_000)
    # Concurrency: a tenant's leased runs at once (0 = no limit), counted while each lease is live by
    # database time; per agent in agent_limits; per concurrency key in the agent definition.
    max_running_per_tenant: int = Field(0, ge=0, le=MAX_COUNT)
    # Fair share: claims interleave tenants by weight (tenant_limits.<tenant>.weight, default 1) within a
    # priority, so one tenant's backlog delays only itself. Off: due runs go by priority, then enqueue order.
    fair_share: bool = True
    # agentrt_claim_wait_seconds: this many tenants (the first a scheduler process claims for) get a label
    # of their own, the rest share "_other", so the metric's series stay bounded.
    claim_wait_tenant_labels: int = Field(20, ge=0, le=1_000)
    # Per-tenant overrides, e.g. {"acme": {"max_queued_runs": 50000, "max_submits_per_s": 200, "max_running": 40,
    # "weight": 2}}.
    tenant_limits: dict[str, TenantLimits] = Field(default_factory=dict)
    # Per-agent limits, e.g. {"refunds": {"max_running": 20}}.
    agent_limits: dict[str, AgentLimits] = Field(default_factory=dict)
    # Queued runs a claim judges per statement; one whose limit is full waits concurrency_recheck_ms
    # out of the claim index (in its place in the order) before it is judged again.
    # Tool limits shared by every executor, judged at Tx1 (BeginToolCall, CompleteAndBeginToolCall):
    # {"openai.chat": {"rate": "100/min", "concurrency": 5}}; per tenant and tool in tenant_tool_limits,
    # {"acme": {"openai.chat": {"rate": "20/min"}}}. Over one: RESOURCE_EXHAUSTED with RetryInfo.
    tool_limits: dict[str, ToolLimit] = Field(default_factory=dict)
    tenant_tool_limits: dict[str, dict[str, ToolLimit]] = Field(default_factory=dict)
    # The RetryInfo delay of a Tx1 refused because the tool's open calls are at its concurrency.
    tool_concurrency_retry_after_ms: int = Field(200, ge=1, le=60_000)
    # Runtime limits (table flow_limits, `agentrt limits set`) override the settings above; each replica
    # reads them again this often (the replica that served the change at once). 0 = on every use.
    limits_refresh_ms: int = Field(1_000, ge=0, le=60_000)
    # Child runs (docs/child-runs.md): SpawnChildren refuses (FAILED_PRECONDITION, SPAWN_LIMIT_EXCEEDED,
    # nothing written) children deeper than max_spawn_depth below their root run (its children are at
    # depth 1), or more than max_descendants_per_root runs below one root, at any depth, ended or not.
    # A cancel cancels a whole tree in one transaction: this bounds it.
    max_spawn_depth: int = Field(10, ge=1, le=1_000)
    max_descendants_per_root: int = Field(1_000, ge=1, le=1_000_000)
    claim_lookahead: int = Field(16, ge=1, le=1_000)
    concurrency_recheck_ms: int = Field(500, ge=10, le=60_000)
    max_payload_bytes: int = Field(1_048_576, ge=1_024, le=MAX_PAYLOAD_BYTES)
    # Per-field limits (bytes of JSON text of one field of one call, never of a whole run); unset =
    # max_payload_bytes. Executors learn them with each lease (Lease.limits).
    # BeginToolCall / next.request_json; response_json of a tool's outcome.
    max_tool_request_bytes: int | None = Field(None, ge=1_024, le=MAX_PAYLOAD_BYTES)
    max_tool_response_bytes: int | None = Field(None, ge=1_024, le=MAX_PAYLOAD_BYTES)
    max_checkpoint_bytes: int | None = Field(None, ge=1_024, le=MAX_PAYLOAD_BYTES)  # every state_json
    # One journal entry's detail_json; unset = 64 KiB (max_payload_bytes when smaller).
    max_journal_entry_bytes: int | None = Field(None, ge=256, le=MAX_PAYLOAD_BYTES)
    # Checkpoint versions kept per run; older (superseded) ones are deleted in the background.
    # 0 = keep every version (the default).
    checkpoint_keep_last: int = Field(0, ge=0, le=MAX_COUNT)
    checkpoint_prune_interval_s: float = Field(30.0, gt=0, le=86_400, allow_inf_nan=False)
    checkpoint_prune_batch_runs: int = Field(500, ge=1, le=100_000)  # runs looked at per statement
    # Retention of terminal runs (docs/retention.md): a sweep every run_retention_interval_s, in
    # batches of run_retention_batch_runs runs with run_retention_pause_ms between them. How long
    # runs are kept is the database's (table retention_policies: `agentrt retention set`).
    run_retention_enabled: bool = True
    run_retention_interval_s: float = Field(300.0, gt=0, le=86_400, allow_inf_nan=False)
    run_retention_batch_runs: int = Field(100, ge=1, le=10_000)
    run_retention_pause_ms: int = Field(200, ge=0, le=60_000)
    claim_poll_interval_ms: int = Field(500, ge=10, le=60_000)
    # How often each replica looks for due schedules (0 = this replica fires none).
    schedule_poll_interval_ms: int = Field(500, ge=0, le=3_600_000)
    max_claim_wait_ms: int = Field(30_000, ge=0, le=3_600_000)
    db_pool_min: int = Field(2, ge=1, le=10_000)
    db_pool_max: int = Field(20, ge=1, le=10_000)
    db_command_timeout_s: float = Field(30.0, gt=0, le=86_400, allow_inf_nan=False)
    # Readiness follows the database (docs/ha.md): this often the scheduler asks whether its pools
    # reach a primary that takes writes; RunService and WorkService answer NOT_SERVING on the health
    # service while none does ("" stays SERVING: the process is alive). 0 = no probe.
    db_probe_interval_s: float = Field(2.0, ge=0, le=3_600, allow_inf_nan=False)
    shutdown_grace_s: float = Field(10.0, ge=0, le=3_600, allow_inf_nan=False)
    # A span per named SQL statement (shared/db.py), where spans are exported: off by default for speed.
    trace_sql: bool = False
    # Database health metrics (scheduler/background/db_health.py), read this often with metrics_addr set; 0 = off.
    db_health_interval_s: float = Field(60.0, ge=0, le=86_400, allow_inf_nan=False)
    # pg_stat_statements (where installed and loaded): a statement is slow at this mean time or more;
    # the slowest this many are exported by query id.
    db_slow_statement_ms: float = Field(100.0, gt=0, le=3_600_000, allow_inf_nan=False)
    db_slow_statement_top: int = Field(5, ge=0, le=50)
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
    # Row-level security (migration 0016) holds only for a role that neither owns the tables nor
    # bypasses RLS (superuser, BYPASSRLS). true: the scheduler refuses to start connected as such a
    # role (the Helm chart sets it with database.roles.enabled); false: a warning at start.
    require_row_security: bool = False
    # How RunService callers authenticate: api_key, jwt, api_key,jwt, or none (every caller may act
    # for any tenant named in x-tenant-id: development only, logged as a warning at start).
    # Sensitive values (docs/encryption.md): the KEK keyring, {"current": id, "keys": {id: base64 of 32
    # bytes}}, from this file or from AGENTRT_ENCRYPTION_KEYS. Unset: agents that mark sensitive fields
    # are refused at submit (FAILED_PRECONDITION), nothing is stored in the clear by mistake.
    encryption_keys_file: str | None = None
    encryption_keys: SecretStr | None = None
    # Data keys kept unwrapped in memory (runs being served); each is re-read from run_data_keys after.
    data_key_cache_size: int = Field(10_000, ge=0, le=1_000_000)
    # Data keys re-wrapped per statement by `agentrt encryption rotate`.
    rotate_batch: int = Field(500, ge=1, le=10_000)
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
    jwt_jwks_refresh_s: float = Field(300.0, gt=0, le=86_400, allow_inf_nan=False)
    jwt_leeway_s: float = Field(30.0, ge=0, le=600, allow_inf_nan=False)
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

    def submit_quota(self, tenant: str) -> SubmitQuota:
        own = self.tenant_limits.get(tenant)
        queued = own.max_queued_runs if own and own.max_queued_runs is not None else self.max_queued_runs_per_tenant
        rate = own.max_submits_per_s if own and own.max_submits_per_s is not None \
            else self.max_submits_per_s_per_tenant
        return SubmitQuota(queued, rate)

    def fair_step(self, tenant: str) -> float:
        """How far one run moves its tenant's fair-share pass: 1/weight (0: fair share off)."""
        if not self.fair_share:
            return 0.0
        own = self.tenant_limits.get(tenant)
        return 1.0 / (own.weight if own and own.weight else 1.0)

    def tool_limits_of(self, tool: str) -> tuple[ToolLimit | None, bool]:
        """The tool's own limit, and whether some tenant has a limit of its own on it."""
        return self.tool_limits.get(tool), any(tool in per_tool for per_tool in self.tenant_tool_limits.values())

    @property
    def concurrency(self) -> ConcurrencyLimits:
        overrides = {t: own.max_running for t, own in sorted(self.tenant_limits.items())
                     if own.max_running is not None}
        agents = {a: own.max_running for a, own in sorted(self.agent_limits.items()) if own.max_running}
        return ConcurrencyLimits(self.max_running_per_tenant, list(overrides), list(overrides.values()),
                                 list(agents), list(agents.values()))

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
