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
