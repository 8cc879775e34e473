-- 0010: composition (issue 19). CANCELLED is a terminal status of its own.
--
-- Until now a cancelled run ended FAILED with terminal_reason 'cancelled: …'
-- and cancel_requested_at set (by the cancel itself, or by the request its
-- holder's write or a claim then applied). Those runs move to CANCELLED; a
-- run that failed for another reason keeps FAILED.
ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_status_check;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_status_check CHECK (
  status IN ('QUEUED', 'RUNNING', 'WAITING_TOOL', 'PAUSED_INDOUBT', 'PAUSED_HUMAN', 'COMPLETED', 'FAILED',
             'CANCELLED'));
ALTER TABLE agent_runs DROP CONSTRAINT finished_only_when_terminal;
ALTER TABLE agent_runs ADD CONSTRAINT finished_only_when_terminal CHECK (
  (status IN ('COMPLETED', 'FAILED', 'CANCELLED')) = (finished_at IS NOT NULL));

UPDATE agent_runs SET status = 'CANCELLED'
WHERE status = 'FAILED' AND cancel_requested_at IS NOT NULL AND terminal_reason LIKE 'cancelled: %';
