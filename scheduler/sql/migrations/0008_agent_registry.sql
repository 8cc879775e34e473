-- The agent registry: which executor serves which agent version, while it lives.
-- An executor rewrites its rows every third of its ttl (RegisterAgents); a row
-- whose expires_at has passed (database time) no longer counts. SubmitRun reads
-- the live rows of one agent: the index is the primary key's leading columns.
CREATE TABLE agent_registry (
  agent_name text NOT NULL,
  agent_version text NOT NULL,
  worker_id text NOT NULL,
  input_schema jsonb,
  tool_names text[] NOT NULL DEFAULT '{}',
  registered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (agent_name, agent_version, worker_id),
  CHECK (expires_at > registered_at),
  CHECK (input_schema IS NULL OR jsonb_typeof(input_schema) = 'object')
);

CREATE INDEX agent_registry_worker_idx ON agent_registry (worker_id);
