-- 0012: retention of terminal runs (README, Security: retention).
--
-- A terminal run whose finish is older than its tenant's policy (or the
-- default policy, tenant '*') is deleted with its checkpoints, ledger rows,
-- journal rows, signals and published outbox rows. Never a run that is not terminal,
-- one labelled `legal_hold`, or one with an unpublished outbox row (pending
-- or parked); never an unpublished outbox row. The database clock decides.

-- Days a terminal run is kept after it finished, per tenant; '*' is the default.
-- Written by the owner only (`agentrt retention set`): the runtime roles read it.
CREATE TABLE retention_policies (
  tenant_id text PRIMARY KEY CHECK (tenant_id = '*' OR length(tenant_id) BETWEEN 1 AND 128),
  keep_days integer NOT NULL CHECK (keep_days BETWEEN 1 AND 36500),
  updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

INSERT INTO retention_policies (tenant_id, keep_days) VALUES ('*', 30);

-- Retention pages through terminal runs by finish time. Status is already
-- indexed, and finished_at changes only with it (on the move to a terminal
-- status), so this index ends no HOT update (see 0004).
CREATE INDEX agent_runs_terminal_finished_idx ON agent_runs (finished_at, id)
  WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- One batch: the next `max_runs` terminal runs after (after_finished, after_id)
-- that the shortest policy lets expire, of which those their own policy lets
-- expire (and that no one holds: SKIP LOCKED) are deleted, children first.
-- Returns how many runs it looked at, the rows it deleted (or, with dry_run,
-- would delete, changing and locking nothing) and where the next batch starts.
--
-- SECURITY DEFINER, on purpose and narrowly: the scheduler role may not
-- DELETE ledger or journal rows, but may run this, which decides by itself
-- (policy table, database clock, terminal status, legal hold, unpublished
-- events) what has expired. The caller chooses only the batch size and the
-- position. Its search_path is pinned below, EXECUTE is revoked from PUBLIC
-- and granted by `agentrt roles apply` to the scheduler role alone.
CREATE FUNCTION agentrt_retention_purge(max_runs integer, dry_run boolean, after_finished timestamptz,
                                        after_id uuid)
RETURNS TABLE (scanned integer, runs bigint, checkpoints bigint, ledger bigint, journal bigint,
               outbox bigint, signals bigint, last_finished timestamptz, last_id uuid)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
  shortest integer;
  fallback integer;
  candidates uuid[];
  doomed uuid[];
  counted bigint;
BEGIN
  IF max_runs IS NULL OR max_runs NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION 'max_runs must be between 1 and 10000' USING ERRCODE = '22023';
  END IF;
  scanned := 0; runs := 0; checkpoints := 0; ledger := 0; journal := 0; outbox := 0; signals := 0;
  SELECT min(p.keep_days) INTO shortest FROM retention_policies p;
  SELECT p.keep_days INTO fallback FROM retention_policies p WHERE p.tenant_id = '*';
  IF shortest IS NULL THEN
    RETURN NEXT;  -- no policy at all: nothing expires
    RETURN;
  END IF;

  WITH page AS (
    SELECT r.id, r.tenant_id, r.finished_at, r.labels
    FROM agent_runs r
    WHERE r.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
      AND (r.finished_at, r.id) > (coalesce(after_finished, '-infinity'::timestamptz),
                                   coalesce(after_id, '00000000-0000-0000-0000-000000000000'::uuid))
      AND r.finished_at < clock_timestamp() - make_interval(days => shortest)
    ORDER BY r.finished_at, r.id
    LIMIT max_runs
  )
  SELECT count(*)::integer,
         (array_agg(page.finished_at ORDER BY page.finished_at DESC, page.id DESC))[1],
         (array_agg(page.id ORDER BY page.finished_at DESC, page.id DESC))[1],
         coalesce(array_agg(page.id) FILTER (
           WHERE page.finished_at < clock_timestamp() - make_interval(days => coalesce(own.keep_days, fallback))
             AND NOT page.labels ? 'legal_hold'
             -- Probed per run through outbox_run_idx. Written as `o.published_at IS NULL`, the
             -- planner may take the pending-rows partial index instead and, with stale statistics
             -- (a relay down, pending rows piling up), scan every pending row for every run.
             AND NOT EXISTS (SELECT 1 FROM (SELECT o.published_at FROM outbox o WHERE o.run_id = page.id
                                            OFFSET 0) AS events
                             WHERE events.published_at IS NULL)),
           '{}')
  INTO scanned, last_finished, last_id, candidates
  FROM page LEFT JOIN retention_policies own ON own.tenant_id = page.tenant_id;

  IF dry_run THEN
    SELECT count(*) INTO checkpoints FROM agent_checkpoints WHERE run_id = ANY (candidates);
    SELECT count(*) INTO ledger FROM tool_executions WHERE run_id = ANY (candidates);
    SELECT count(*) INTO journal FROM run_journal WHERE run_id = ANY (candidates);
    SELECT count(*) INTO outbox FROM outbox WHERE run_id = ANY (candidates) AND published_at IS NOT NULL;
    SELECT count(*) INTO signals FROM run_signals WHERE run_id = ANY (candidates);
    runs := cardinality(candidates);
    RETURN NEXT;
    RETURN;
  END IF;

  SELECT coalesce(array_agg(locked.id), '{}') INTO doomed FROM (
    SELECT r.id FROM agent_runs r
    WHERE r.id = ANY (candidates) AND r.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
    ORDER BY r.id
    FOR UPDATE SKIP LOCKED) AS locked;
  DELETE FROM agent_checkpoints WHERE run_id = ANY (doomed);
  GET DIAGNOSTICS counted = ROW_COUNT; checkpoints := counted;
  DELETE FROM tool_executions WHERE run_id = ANY (doomed);
  GET DIAGNOSTICS counted = ROW_COUNT; ledger := counted;
  DELETE FROM run_journal WHERE run_id = ANY (doomed);
  GET DIAGNOSTICS counted = ROW_COUNT; journal := counted;
  DELETE FROM outbox WHERE run_id = ANY (doomed) AND published_at IS NOT NULL;
  GET DIAGNOSTICS counted = ROW_COUNT; outbox := counted;
  DELETE FROM run_signals WHERE run_id = ANY (doomed);
  GET DIAGNOSTICS counted = ROW_COUNT; signals := counted;
  DELETE FROM agent_runs WHERE id = ANY (doomed);
  GET DIAGNOSTICS counted = ROW_COUNT; runs := counted;
  RETURN NEXT;
END;
$$;

-- Pinned to this schema (then pg_temp, last: a caller's temporary table cannot
-- stand in for one of ours), and a row held elsewhere is skipped or waited for
-- briefly, never long.
DO $$
BEGIN
  EXECUTE format('ALTER FUNCTION agentrt_retention_purge(integer, boolean, timestamptz, uuid) '
                 'SET search_path = pg_catalog, %I, pg_temp', current_schema());
END;
$$;
ALTER FUNCTION agentrt_retention_purge(integer, boolean, timestamptz, uuid) SET lock_timeout = '2s';
REVOKE EXECUTE ON FUNCTION agentrt_retention_purge(integer, boolean, timestamptz, uuid) FROM PUBLIC;
