-- 0018: a schedule's sensitive input sealed at rest (README: Security, "Sensitive values").
--
-- A schedule whose agent marks input fields keeps those values sealed in its
-- `input` under its own data key (the schedule id as associated data), stored
-- here only wrapped by a KEK and with that KEK's id, as run_data_keys holds a
-- run's. A fire opens them and seals them again under the new run's key.
-- `agentrt encryption rotate` re-wraps these keys too. NULL: nothing sealed.
ALTER TABLE agent_schedules
  ADD COLUMN key_id text,
  ADD COLUMN wrapped_key bytea,
  ADD COLUMN key_rotated_at timestamptz,
  ADD CONSTRAINT agent_schedules_key_check CHECK ((key_id IS NULL) = (wrapped_key IS NULL)
                                                  AND (key_id IS NULL OR length(key_id) BETWEEN 1 AND 200));

-- Rotation walks the schedule keys wrapped by any other KEK than the current one.
CREATE INDEX agent_schedules_key_idx ON agent_schedules (key_id, id) WHERE key_id IS NOT NULL;
