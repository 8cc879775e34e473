"""Executor settings: env AGENTRT_*, or the `executor:` section of AGENTRT_CONFIG_FILE."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from shared.config import ComponentSettings
from shared.transport import ClientTls, require_tls


class ModelPrice(BaseModel):
    """What a model's tokens cost, in US dollars per million (as providers publish them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input: float = Field(0.0, ge=0)  # uncached prompt tokens
    output: float = Field(0.0, ge=0)
    cached_input: float | None = Field(None, ge=0)  # prompt tokens read from the cache (None: as input)
    cache_write: float | None = Field(None, ge=0)  # prompt tokens written to the cache (None: as input)


class ExecutorSettings(ComponentSettings):
    section: ClassVar[str] = "executor"

    service_name: str = "agentrt-executor"
    scheduler_addr: str = "127.0.0.1:50051"
    # A directory of *.yaml / *.yml / *.toml agent definitions, or files separated by commas.
    agents_path: str = "agents"
    # Concurrent runs this process holds leases on.
    slots: int = Field(4, ge=1, le=10_000)
    # Concurrent ClaimWork long-polls (each waits for a free slot first).
    claimers: int = Field(1, ge=1, le=64)
    claim_wait_ms: int = Field(10_000, ge=0, le=60_000)
    # Heartbeat at this fraction of the lease (never more than a third), or the
    # scheduler's advised interval when that is shorter.
    heartbeat_fraction: float = Field(1 / 3, gt=0, le=1 / 3)
    # Per-call deadline for scheduler RPCs; calls whose outcome is unknown are
    # retried with the same event id until the lease would lapse.
    rpc_timeout_s: float = Field(10.0, gt=0)
    # Writes (checkpoints, Tx1/Tx2, heartbeats, finish) of concurrent runs leave together in
    # WriteBatch calls, at most batch_in_flight at a time and batch_max_items per call; each
    # item commits or is refused on its own. false = one call per write.
    batch_writes: bool = True
    batch_max_items: int = Field(64, ge=1, le=256)
    batch_in_flight: int = Field(2, ge=1, le=64)
    # The agents this executor serves are registered with the scheduler for this long, refreshed
    # every third of it (a submit for an agent no live executor serves is refused).
    registration_ttl_ms: int = Field(30_000, ge=1_000, le=3_600_000)
    health_addr: str = "0.0.0.0:50052"
    # SIGTERM: stop claiming, cancel model calls at once, give in-flight tool
    # calls and scheduler writes until this many seconds, then exit.
    shutdown_grace_s: float = Field(10.0, ge=0)
    worker_id: str = ""
    # Keys for `openai` / `anthropic` deciders whose definition names no api_key_file or api_key_env.
    openai_api_key: SecretStr | None = None
    anthropic_api_key: SecretStr | None = None
    # Model prices by model name (the decider's `model`, else the name the provider answered with), e.g.
    # AGENTRT_MODEL_PRICES='{"claude-sonnet-4-5": {"input": 3, "output": 15, "cached_input": 0.3,
    # "cache_write": 3.75}}'. Each call's cost is charged to the run's cost budget before the next call.
    model_prices: dict[str, ModelPrice] = Field(default_factory=dict)
    # The scheduler's executor token (its `work_token`), sent on every WorkService call; only
    # over TLS unless scheduler_insecure says plaintext on purpose.
    work_token: SecretStr | None = None
    # TLS to the scheduler: the CA that signed its certificate; for mutual TLS this executor's
    # certificate and key (its identity must be in the scheduler's work_client_identities).
    scheduler_tls_ca_file: str | None = None
    scheduler_tls_cert_file: str | None = None
    scheduler_tls_key_file: str | None = None
    scheduler_tls_server_name: str | None = None  # the name checked in the scheduler's certificate
    # true = plaintext to the scheduler even though a credential is sent (development only).
    scheduler_insecure: bool = False
    # The RunService API key (operator role) the in-process reconciler acts with.
    run_api_key: SecretStr | None = None
    # Tenants whose PAUSED_INDOUBT runs the reconciler sweeps (RunService is tenant-scoped);
    # empty = no reconciler in this process (`agentrt reconcile` runs one on its own).
    reconcile_tenants: list[str] = Field(default_factory=list)
    reconcile_interval_s: float = Field(30.0, gt=0)
    # Fault injection for tests and the acceptance suite (never set in production):
    # specs like after_checkpoint_commit or before_tool_send@run=ID,occurrence=2,action=sigstop
    # (executor.faults lists the points, shared.faults the options). `raise` abandons the run
    # in-process; `exit` / `sigkill` end the process at once; `sigstop` pauses it until SIGCONT.
    fault_points: list[str] = Field(default_factory=list)
    fault_action: str = Field("raise", pattern="^(raise|exit|sigkill|sigstop)$")

    @model_validator(mode="after")
    def _check(self) -> ExecutorSettings:
        if self.claimers > self.slots:
            self.claimers = self.slots
        if bool(self.scheduler_tls_cert_file) != bool(self.scheduler_tls_key_file):
            raise ValueError("scheduler_tls_cert_file and scheduler_tls_key_file go together")
        credential = self.work_token is not None or self.run_api_key is not None
        require_tls(credential=credential, tls=self.scheduler_tls, insecure=self.scheduler_insecure,
                    what="executor")
        return self

    @property
    def scheduler_tls(self) -> ClientTls | None:
        """TLS to the scheduler, when a CA or a client certificate is configured."""
        if not (self.scheduler_tls_ca_file or self.scheduler_tls_cert_file):
            return None
        return ClientTls(self.scheduler_tls_ca_file, self.scheduler_tls_cert_file, self.scheduler_tls_key_file,
                         self.scheduler_tls_server_name)
