-- 0006: GetRunHistory pages a run's ledger rows in intent order without
-- sorting all of them on every page.
--
-- The index is partial on a condition only the history query states. An index
-- leading with run_id is otherwise as cheap to the planner as the
-- (run_id, step_key) unique index on a young table, and a ledger write planned
-- then would scan every ledger row of its run to find its step: a long run's
-- steps would cost more as it grows (tests/integration/test_query_plans.py).
CREATE INDEX tool_executions_run_intent_idx ON tool_executions (run_id, outbound_intent_at, id)
  WHERE outbound_intent_at > '-infinity'::timestamptz;
