-- 0003: commit-unknown recovery for writes that leave no checkpoint or ledger
-- row of their own (FinishRun, MarkToolInDoubt, a takeover's NOT_EXECUTED).
-- The run row records the caller's event id of the write that last moved it,
-- so a retry can tell "committed, event lost" from "never committed".
ALTER TABLE agent_runs ADD COLUMN last_event_id uuid;
