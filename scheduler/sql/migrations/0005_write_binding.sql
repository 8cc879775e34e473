-- 0005: an event id is bound to the write it was first used for.
-- A fenced write's outbox row records which WorkService operation wrote it
-- (write_op) and a SHA-256 over the lease and the request's fields
-- (write_hash). A retry with the same event id is a replay only when both
-- match; another operation, another payload or another lease reusing the id
-- is refused and changes nothing. Rows written by operator paths and submit
-- carry neither, so no fenced write can replay as one of them.
ALTER TABLE outbox ADD COLUMN write_op text;
ALTER TABLE outbox ADD COLUMN write_hash bytea CHECK (write_hash IS NULL OR length(write_hash) = 32);

-- A terminal run holds no open intent: a run ended while its tool call was
-- in flight (cancel or deadline applied without its holder) leaves the
-- ledger row IN_DOUBT for reconciliation, never OUTBOUND_INTENT. Rows left
-- open by earlier versions are moved now.
UPDATE tool_executions AS te
SET status = 'IN_DOUBT', error_code = COALESCE(te.error_code, 'run_ended_with_open_intent')
FROM agent_runs AS r
WHERE te.run_id = r.id AND te.status = 'OUTBOUND_INTENT' AND r.status IN ('COMPLETED', 'FAILED');
