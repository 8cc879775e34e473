-- 0014: child runs (issue 19). A decision may spawn child runs and wait for
-- all or any of them (WorkService.SpawnChildren, then FinishRun SLEEP with
-- wait_children).
--
-- A child carries its parent's id, the parent's step key that spawned it
-- (spawn_key: one spawn group per step) and its index in that group. Its id and
-- client_request_id are derived from (parent, spawn_key, index), so a spawn
-- repeated after a crash or a takeover finds the children it made. No foreign
-- key: retention may delete a parent before its children (the tree read
-- tolerates a missing parent). `detached` children are not cancelled with
-- their parent.
ALTER TABLE agent_runs ADD COLUMN parent_run_id uuid;
ALTER TABLE agent_runs ADD COLUMN spawn_key text;
ALTER TABLE agent_runs ADD COLUMN spawn_index integer;
ALTER TABLE agent_runs ADD COLUMN detached boolean NOT NULL DEFAULT false;
ALTER TABLE agent_runs ADD CONSTRAINT child_fields_together CHECK (
  (parent_run_id IS NULL) = (spawn_key IS NULL) AND (parent_run_id IS NULL) = (spawn_index IS NULL));

-- The join a parent waits on, on the parent's row, so that the write that parks
-- the parent and the write that ends a child meet on one locked row (as signals
-- do, migration 0010): the group (join_key), ALL or ANY, how many children it
-- has and how many of them have ended. join_done is counted by the trigger
-- below, in the transaction in which a child ends. awaiting_join is set while
-- the parent is parked on a join that is not satisfied yet. None is indexed
-- (HOT updates, migration 0004).
ALTER TABLE agent_runs ADD COLUMN join_key text;
ALTER TABLE agent_runs ADD COLUMN join_mode text CHECK (join_mode IS NULL OR join_mode IN ('ALL', 'ANY'));
ALTER TABLE agent_runs ADD COLUMN join_total integer NOT NULL DEFAULT 0;
ALTER TABLE agent_runs ADD COLUMN join_done integer NOT NULL DEFAULT 0;
ALTER TABLE agent_runs ADD COLUMN awaiting_join boolean NOT NULL DEFAULT false;

-- A parent's children, by group and index (the spawn, the join's answer, the
-- tree and the cancel cascade). Its columns never change after insert.
CREATE INDEX agent_runs_parent_idx ON agent_runs (parent_run_id, spawn_key, spawn_index)
  WHERE parent_run_id IS NOT NULL;

-- A child reaching a terminal status counts towards its parent's join when the
-- parent waits on (or is about to wait on) the child's group; when that
-- satisfies a join the parent is parked on, the parent is due at once and
-- claimers are woken (pg_notify is delivered at commit). Every path that ends
-- a run (FinishRun, a cancel, a deadline, an approval rejected, a tool call's
-- end) goes through here. Lock order: the child's row, then its parent's.
CREATE FUNCTION agentrt_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  woken text;
BEGIN
  UPDATE agent_runs AS p
  SET join_done = p.join_done + 1,
      next_attempt_at = CASE
        WHEN p.awaiting_join AND p.status = 'QUEUED' AND (p.join_mode = 'ANY' OR p.join_done + 1 >= p.join_total)
        THEN least(p.next_attempt_at, clock_timestamp()) ELSE p.next_attempt_at END,
      awaiting_join = p.awaiting_join AND NOT (p.join_mode = 'ANY' OR p.join_done + 1 >= p.join_total),
      updated_at = clock_timestamp()
  WHERE p.id = NEW.parent_run_id AND p.join_key = NEW.spawn_key
  RETURNING CASE WHEN p.status = 'QUEUED' AND NOT p.awaiting_join AND p.next_attempt_at <= clock_timestamp()
                 THEN p.agent_name END INTO woken;
  IF woken IS NOT NULL THEN
    PERFORM pg_notify('agentrt_work', woken);
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER agent_runs_child_ended
  AFTER UPDATE OF status ON agent_runs
  FOR EACH ROW
  WHEN (NEW.parent_run_id IS NOT NULL AND NEW.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
        AND OLD.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED'))
  EXECUTE FUNCTION agentrt_child_ended();
