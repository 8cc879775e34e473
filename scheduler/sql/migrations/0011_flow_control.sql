-- 0011: flow control (README: Flow control).
--
-- Priority: 1 (lowest) .. 9 (highest), claimed first among due runs.
-- enqueued_at: when the run first entered the queue (its submit); kept across
-- every wait (sleep, approval, retry backoff), so a run coming back from one is
-- ordered by the time it first asked for work and fresh submissions cannot
-- starve it.
-- claim_ready: false while a re-queued run waits for its next_attempt_at. The
-- claim statement turns due ones ready (a few per claim, through
-- agent_claim_waking_idx) and picks among ready runs in claim order through
-- agent_claim_ready_idx: neither path reads a row that is not due or not ready.
-- The claim still checks next_attempt_at, so a ready flag is never a licence
-- to run early; it only partitions the index.
ALTER TABLE agent_runs
  ADD COLUMN priority smallint NOT NULL DEFAULT 5 CHECK (priority BETWEEN 1 AND 9),
  ADD COLUMN enqueued_at timestamptz,
  ADD COLUMN claim_ready boolean NOT NULL DEFAULT true;
UPDATE agent_runs SET enqueued_at = created_at;
ALTER TABLE agent_runs
  ALTER COLUMN enqueued_at SET NOT NULL,
  ALTER COLUMN enqueued_at SET DEFAULT clock_timestamp();

DROP INDEX agent_claim_queued_idx;
CREATE INDEX agent_claim_ready_idx
  ON agent_runs (priority DESC, enqueued_at, id) WHERE status = 'QUEUED' AND claim_ready;
CREATE INDEX agent_claim_waking_idx
  ON agent_runs (next_attempt_at) WHERE status = 'QUEUED' AND NOT claim_ready;

-- An agent version's default priority, from its definition (NULL: the scheduler's default).
ALTER TABLE agent_registry
  ADD COLUMN default_priority smallint CHECK (default_priority BETWEEN 1 AND 9);

-- Concurrency limits (README: Flow control). A run holds a slot of its tenant,
-- its agent and its concurrency key while it is leased and its lease is live by
-- database time: an executor killed mid-run keeps the slot until the lease
-- lapses. The key is rendered at submit from the agent definition's template
-- (`${input.customer_id}`) and scoped to the tenant and agent; concurrency_max
-- is that key's limit. Claims count live leased runs per group through these
-- partial indexes, each count bounded by the limit. A queued run whose limit is
-- full is parked (claim_ready false, next_attempt_at a recheck away, waiting_on
-- the limit) and keeps its enqueued_at.
ALTER TABLE agent_runs
  ADD COLUMN concurrency_key text CHECK (length(concurrency_key) <= 500),
  ADD COLUMN concurrency_max integer CHECK (concurrency_max > 0),
  ADD COLUMN waiting_on text CHECK (waiting_on IN ('tenant', 'agent', 'key')),
  ADD CONSTRAINT concurrency_key_with_max CHECK ((concurrency_key IS NULL) = (concurrency_max IS NULL));
-- Their predicate names the lease owner (the same rows as the leased statuses,
-- by lease_only_when_leased_status) so the claim's expired path, which names
-- the statuses, keeps agent_claim_expired_idx.
CREATE INDEX agent_leased_tenant_idx
  ON agent_runs (tenant_id) WHERE lease_owner IS NOT NULL;
CREATE INDEX agent_leased_agent_idx
  ON agent_runs (agent_name) WHERE lease_owner IS NOT NULL;
CREATE INDEX agent_leased_key_idx
  ON agent_runs (tenant_id, agent_name, concurrency_key)
  WHERE lease_owner IS NOT NULL AND concurrency_key IS NOT NULL;

-- An agent version's concurrency key template and its limit, from its definition.
ALTER TABLE agent_registry
  ADD COLUMN concurrency_key text,
  ADD COLUMN concurrency_max integer CHECK (concurrency_max > 0),
  ADD CONSTRAINT registry_concurrency_key_with_max CHECK ((concurrency_key IS NULL) = (concurrency_max IS NULL));

-- Tool limits (README: Flow control), judged at Tx1 from the ledger under a
-- per-tool advisory lock: calls of a tool in its rate window by intent time,
-- and its open (OUTBOUND_INTENT) calls.
CREATE INDEX tool_executions_tool_intent_idx ON tool_executions (tool_name, outbound_intent_at);
-- (completed_at IS NULL: true of every open row, and named by no ledger write, so
-- they keep finding their row by (run_id, step_key): test_query_plans.py.)
CREATE INDEX tool_executions_tool_open_idx ON tool_executions (tool_name)
  WHERE status = 'OUTBOUND_INTENT' AND completed_at IS NULL;
