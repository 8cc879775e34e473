-- 0022: agent_runs' checks on the fields a submit fixes, paid by the statements
-- that write those fields only (docs/performance/step-profile.md).
--
-- PostgreSQL evaluates every CHECK constraint of a table on every UPDATE of a
-- row, whichever columns it sets, and each statement reads every one back from
-- its stored node text and prepares it again (ExecRelCheck, up to version 18 at
-- least). agent_runs had 25 of them (about 18 KB of node text), paid by each
-- fenced step's UPDATE: with all of them dropped in a throwaway migration,
-- PostgreSQL backend CPU per step fell from 2.30 to 1.67-1.89 ms (bench
-- step_profile, its embedded PostgreSQL 18).
--
-- Thirteen of them hold fields that no statement changes after the submit:
-- they move to one AFTER row trigger that fires on INSERT and on an UPDATE that
-- sets one of those columns, and refuses with the same SQLSTATE (23514) and the
-- same constraint name as before, so nothing stored or refused changes. The
-- checks of the reference design's table, and every check of a column the
-- work path updates, stay CHECK constraints (tests/integration/scheduler/
-- test_db_invariants.py sweeps both sets).
CREATE FUNCTION agentrt_runs_check_fixed_fields() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  failed text;
BEGIN
  -- IS FALSE, as a CHECK constraint: a NULL result passes.
  failed := CASE
    WHEN (length(NEW.agent_name) BETWEEN 1 AND 200) IS FALSE THEN 'agent_runs_agent_name_check'
    WHEN (NEW.budget_max_cost_usd >= 0) IS FALSE THEN 'agent_runs_budget_max_cost_usd_check'
    WHEN (NEW.budget_max_steps >= 0) IS FALSE THEN 'agent_runs_budget_max_steps_check'
    WHEN (NEW.budget_max_tokens >= 0) IS FALSE THEN 'agent_runs_budget_max_tokens_check'
    WHEN (length(NEW.concurrency_key) <= 500) IS FALSE THEN 'agent_runs_concurrency_key_check'
    WHEN (NEW.concurrency_max > 0) IS FALSE THEN 'agent_runs_concurrency_max_check'
    WHEN (jsonb_typeof(NEW.input) = 'object') IS FALSE THEN 'agent_runs_input_check'
    WHEN (jsonb_typeof(NEW.labels) = 'object') IS FALSE THEN 'agent_runs_labels_check'
    WHEN (NEW.priority BETWEEN 1 AND 9) IS FALSE THEN 'agent_runs_priority_check'
    WHEN (length(NEW.tenant_id) BETWEEN 1 AND 128) IS FALSE THEN 'agent_runs_tenant_id_check'
    WHEN ((NEW.parent_run_id IS NULL) = (NEW.spawn_key IS NULL)
          AND (NEW.parent_run_id IS NULL) = (NEW.spawn_index IS NULL)) IS FALSE THEN 'child_fields_together'
    WHEN ((NEW.client_request_id IS NULL) = (NEW.submit_hash IS NULL)) IS FALSE THEN 'client_request_id_with_hash'
    WHEN ((NEW.concurrency_key IS NULL) = (NEW.concurrency_max IS NULL)) IS FALSE THEN 'concurrency_key_with_max'
  END;
  IF failed IS NOT NULL THEN
    RAISE EXCEPTION 'new row for relation "agent_runs" violates check constraint "%"', failed
      USING ERRCODE = 'check_violation', CONSTRAINT = failed, TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
  END IF;
  RETURN NULL;
END
$$;

-- Named to fire before agent_runs_child_ended (AFTER triggers fire in name order).
CREATE TRIGGER agent_runs_check_fixed_fields
  AFTER INSERT OR UPDATE OF agent_name, budget_max_cost_usd, budget_max_steps, budget_max_tokens, concurrency_key,
    concurrency_max, input, labels, priority, tenant_id, parent_run_id, spawn_key, spawn_index, client_request_id,
    submit_hash
  ON agent_runs FOR EACH ROW EXECUTE FUNCTION agentrt_runs_check_fixed_fields();

ALTER TABLE agent_runs
  DROP CONSTRAINT agent_runs_agent_name_check,
  DROP CONSTRAINT agent_runs_budget_max_cost_usd_check,
  DROP CONSTRAINT agent_runs_budget_max_steps_check,
  DROP CONSTRAINT agent_runs_budget_max_tokens_check,
  DROP CONSTRAINT agent_runs_concurrency_key_check,
  DROP CONSTRAINT agent_runs_concurrency_max_check,
  DROP CONSTRAINT agent_runs_input_check,
  DROP CONSTRAINT agent_runs_labels_check,
  DROP CONSTRAINT agent_runs_priority_check,
  DROP CONSTRAINT agent_runs_tenant_id_check,
  DROP CONSTRAINT child_fields_together,
  DROP CONSTRAINT client_request_id_with_hash,
  DROP CONSTRAINT concurrency_key_with_max;
