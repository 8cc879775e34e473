-- 0023: agent_runs' checks on its status, lease, finish, retry and tree
-- columns are paid by the statements that set those columns, not by every
-- fenced step (docs/performance/step-profile.md).
--
-- PostgreSQL evaluates every CHECK constraint of a table on every UPDATE, and
-- each statement first reads each one back from its stored node text and
-- prepares it again (ExecRelCheck, versions 15 and 18 alike). A fenced step's
-- UPDATE of agent_runs sets the version, the step key, the journal length, the
-- attempt count and updated_at, yet it paid for all twelve checks left after
-- migration 0022. Measured as backend CPU per committed UPDATE by id on
-- PostgreSQL 15 (median of seven rounds): 56 us with the twelve CHECKs, 23 us
-- with none.
--
-- Ten of them read only columns the step never sets. They move to one AFTER
-- row trigger that fires on INSERT and on an UPDATE that sets one of the
-- columns they read (claims, heartbeats, pauses, finishes), and refuses with
-- the same SQLSTATE (23514, check_violation) and the same constraint name, in
-- the order PostgreSQL tested them (by name). The two whose columns the step
-- sets (version >= 0, attempt_count >= 0) stay CHECK constraints; when a row
-- breaks one of those and a moved one at once, the CHECK is the one named.
-- tests/integration/scheduler/test_db_invariants.py sweeps every name and the
-- rule itself: a CHECK left on a table a step updates reads a column the step
-- sets.
CREATE FUNCTION agentrt_runs_check_current_state() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  failed text;
BEGIN
  -- IS FALSE, as a CHECK constraint: a NULL result passes.
  failed := CASE
    WHEN (NEW.fencing_token >= 0) IS FALSE THEN 'agent_runs_fencing_token_check'
    WHEN (NEW.join_mode IS NULL OR NEW.join_mode IN ('ALL', 'ANY')) IS FALSE THEN 'agent_runs_join_mode_check'
    WHEN (NEW.max_attempts > 0) IS FALSE THEN 'agent_runs_max_attempts_check'
    WHEN (NEW.spawn_depth >= 0) IS FALSE THEN 'agent_runs_spawn_depth_check'
    WHEN (NEW.status IN ('QUEUED', 'RUNNING', 'WAITING_TOOL', 'PAUSED_INDOUBT', 'PAUSED_HUMAN',
                         'COMPLETED', 'FAILED', 'CANCELLED')) IS FALSE THEN 'agent_runs_status_check'
    WHEN (NEW.waiting_on IN ('tenant', 'agent', 'key')) IS FALSE THEN 'agent_runs_waiting_on_check'
    WHEN ((NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')) = (NEW.finished_at IS NOT NULL)) IS FALSE
      THEN 'finished_only_when_terminal'
    WHEN ((NEW.status IN ('RUNNING', 'WAITING_TOOL')) = (NEW.lease_owner IS NOT NULL)) IS FALSE
      THEN 'lease_only_when_leased_status'
    WHEN ((NEW.lease_owner IS NULL) = (NEW.lease_expires_at IS NULL)) IS FALSE THEN 'lease_owner_with_expiry'
    WHEN ((NEW.parent_run_id IS NULL) = (NEW.root_run_id IS NULL)
          AND (NEW.parent_run_id IS NULL) = (NEW.spawn_depth = 0)) IS FALSE THEN 'root_only_for_children'
  END;
  IF failed IS NULL THEN
    RETURN NULL;  -- an AFTER trigger's result is ignored
  END IF;
  -- As a CHECK refuses, so the message and the fields a client reads are the same.
  RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, failed
    USING ERRCODE = 'check_violation', CONSTRAINT = failed, TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
END
$$;

-- AFTER triggers fire in name order: this one, then agent_runs_check_fixed_fields
-- (0022), then agent_runs_child_ended.
CREATE TRIGGER agent_runs_check_current_state
  AFTER INSERT OR UPDATE OF fencing_token, join_mode, max_attempts, spawn_depth, status, waiting_on, finished_at,
    lease_owner, lease_expires_at, parent_run_id, root_run_id
  ON agent_runs FOR EACH ROW EXECUTE FUNCTION agentrt_runs_check_current_state();

ALTER TABLE agent_runs
  DROP CONSTRAINT agent_runs_fencing_token_check,
  DROP CONSTRAINT agent_runs_join_mode_check,
  DROP CONSTRAINT agent_runs_max_attempts_check,
  DROP CONSTRAINT agent_runs_spawn_depth_check,
  DROP CONSTRAINT agent_runs_status_check,
  DROP CONSTRAINT agent_runs_waiting_on_check,
  DROP CONSTRAINT finished_only_when_terminal,
  DROP CONSTRAINT lease_only_when_leased_status,
  DROP CONSTRAINT lease_owner_with_expiry,
  DROP CONSTRAINT root_only_for_children;
