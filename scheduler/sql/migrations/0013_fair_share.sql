-- 0013: fair share between tenants (README: Flow control, "Fair share").
--
-- Stride scheduling. Every run gets a pass at submit: its tenant's newest
-- QUEUED pass at the run's priority plus 1/weight of its tenant, or the head
-- of that priority's ready queue when that is further on (a tenant that was
-- idle joins at the front, not behind its own past). The ready index orders
-- runs by (priority, pass, first enqueue), so the claim stays one scan of one
-- index: a tenant with 20,000 queued runs has passes 1..20,000 while a quiet
-- tenant's next run lands next to the head, and tenants with backlogs are
-- served in proportion to their weights. A run keeps its pass across every
-- wait (like enqueued_at), so a run back from one is not overtaken by fresh
-- submissions of its tenant or of any tenant that joined after it.
-- Rows from before this migration have pass 0 (they go first, by enqueue).
ALTER TABLE agent_runs ADD COLUMN fair_pass double precision NOT NULL DEFAULT 0;

DROP INDEX agent_claim_ready_idx;
CREATE INDEX agent_claim_ready_idx
  ON agent_runs (priority DESC, fair_pass, enqueued_at, id) WHERE status = 'QUEUED' AND claim_ready;
-- A tenant's newest pass at a priority, read at submit (one index probe).
CREATE INDEX agent_queued_pass_idx
  ON agent_runs (tenant_id, priority, fair_pass) WHERE status = 'QUEUED';
