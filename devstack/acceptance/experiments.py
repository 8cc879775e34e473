"""The acceptance matrix (docs/design.md §acceptance-and-evidence): id, title, injection, invariant, body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from devstack.acceptance import experiments_executor as ex
from devstack.acceptance import experiments_ha as ha
from devstack.acceptance import experiments_platform as pl
from devstack.acceptance.lab import Lab


@dataclass(frozen=True)
class Experiment:
    id: str
    title: str
    injection: str
    expected: str
    body: Callable[[Lab], Awaitable[None]]
    timeout_s: float = 300.0
    # In the default list (`agentrt acceptance` without --only: experiments 1-9). Experiment 10
    # needs Patroni and etcd and runs by itself (--only 10; tests/acceptance/test_primary_failover.py).
    default: bool = True


EXPERIMENTS: dict[str, Experiment] = {e.id: e for e in (
    Experiment("1", "crash after checkpoint commit", "after_checkpoint_commit (SIGKILL self)",
               "A new executor continues from the committed checkpoint version; completed steps are not redone "
               "(one mock request per idempotency key).", ex.crash_after_checkpoint_commit),
    Experiment("2", "crash after the tool answered, before Tx2", "after_tool_response_before_tx2_commit (SIGKILL self)",
               "Without a lookup or idempotency contract the request is not resent and the ledger row is IN_DOUBT; "
               "with a lookup the step is resolved with recorded evidence.", ex.crash_before_tx2),
    Experiment("3", "stale fence after a pause", "before_tool_send (SIGSTOP self), SIGCONT after the takeover",
               "A's CAS writes affect 0 rows; version and checkpoint count stay consistent; A's late tool request "
               "carries its old fence and the fence-aware mock refuses it.", ex.stale_fence),
    Experiment("4", "crash after broker ack, before outbox mark", "after_broker_ack_before_outbox_mark (SIGKILL self)",
               "Events may be published twice; the consumer's business table applies each event exactly once.",
               pl.crash_after_broker_ack),
    Experiment("5", "checkpoint schema upgrade", "old checkpoints read by a newer executor image (and back)",
               "A checkpoint of an older schema is migrated explicitly or refused with a reason; never parsed into "
               "zero values.", ex.checkpoint_schema_upgrade),
    Experiment("6", "tenant isolation", "cross-tenant RunService calls with real API keys, and forged leases",
               "Another tenant's runs cannot be read, listed, claimed, resumed, cancelled or resolved with that "
               "tenant's own key, nor can the key name the owner's tenant; nothing about them changes.",
               pl.tenant_isolation),
    Experiment("7", "PostgreSQL restart mid-load", "pg_ctl restart -m immediate",
               "Services reconnect without restarts; no committed progress is lost; no run is stuck; every event "
               "is applied once.", pl.postgres_restart),
    Experiment("8", "broker stop and restart mid-load", "Tansu SIGTERM, started again on the same port",
               "Nothing is marked published while the broker is down; every event is delivered and applied once "
               "afterwards.", pl.broker_restart),
    Experiment("9", "network partition of one executor", "executor in a network namespace, its link cut",
               "The partitioned executor's lease lapses, another executor takes over, and the partitioned one's "
               "writes are refused when it returns.", pl.partition, timeout_s=300.0),
    Experiment("10", "primary lost", "Patroni switchover; SIGKILL of the leader's Patroni and postmaster "
               "(failover); the old leader back as a standby (pg_rewind)",
               "Services ride it out without restarts; no acknowledged commit and no committed checkpoint, "
               "ledger row, journal entry or outbox row lost; fencing tokens never go back; every run "
               "completes; every event applied once; time to recover reported.", ha.primary_lost,
               timeout_s=420.0, default=False),
)}
DEFAULT_IDS = [e.id for e in EXPERIMENTS.values() if e.default]
