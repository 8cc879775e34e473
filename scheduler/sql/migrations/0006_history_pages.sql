-- 0006: GetRunHistory pages a run's ledger rows in intent order without
-- sorting all of them on every page.
CREATE INDEX tool_executions_run_intent_idx ON tool_executions (run_id, outbound_intent_at, id);
