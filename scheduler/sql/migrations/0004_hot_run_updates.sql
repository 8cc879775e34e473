-- 0004: let checkpoint writes be HOT updates.
-- Every write sets agent_runs.updated_at; while an index covered it, no update
-- of a run could be heap-only, so each SaveCheckpoint/Tx2 also wrote a new
-- entry into every index of the table. The tenant/status index now orders by
-- created_at (ListRuns pages by it anyway), and pages keep free space so an
-- updated row version fits beside the old one.
DROP INDEX agent_runs_tenant_status_idx;
CREATE INDEX agent_runs_tenant_status_idx ON agent_runs (tenant_id, status, created_at DESC);
ALTER TABLE agent_runs SET (fillfactor = 80);
