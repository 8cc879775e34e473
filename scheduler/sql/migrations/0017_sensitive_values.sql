-- 0017: sensitive values (README: Security, "Sensitive values").
--
-- One data key per run whose agent marks sensitive fields, stored only wrapped
-- by a key-encryption key (KEK) and with that KEK's id, so a keyring can hold
-- the old KEK for reading while `agentrt encryption rotate` re-wraps every key
-- under the current one. `sensitive` is what the agent version marked when the
-- run was submitted (paths into its input and each tool's input and output):
-- later ledger writes seal by it, whatever the registry says since.
-- Retention deletes a run's key with the run (ON DELETE CASCADE, inside
-- agentrt_retention_purge); nothing else deletes one.
CREATE TABLE run_data_keys (
  run_id uuid PRIMARY KEY REFERENCES agent_runs(id) ON DELETE CASCADE,
  tenant_id text NOT NULL,  -- the run's, for row-level security (a submit writes both in one statement)
  key_id text NOT NULL,
  wrapped_key bytea NOT NULL,
  sensitive jsonb NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  rotated_at timestamptz,
  CHECK (length(key_id) BETWEEN 1 AND 200),
  CHECK (jsonb_typeof(sensitive) = 'object')
);

-- Rotation walks the keys wrapped by any other KEK than the current one.
CREATE INDEX run_data_keys_key_idx ON run_data_keys (key_id, run_id);

-- What each registered agent version marks sensitive (its input schema's and its tools' schemas'
-- properties with "x-agentrt-sensitive": true); NULL: nothing.
ALTER TABLE agent_registry ADD COLUMN sensitive jsonb;

-- Row-level security as every tenant table (0016): the run's tenant, or the
-- work scope (the lease holder's reads, rotation). A tenant column rather than
-- agentrt_tenant_run(run_id): the key is written in the statement that inserts
-- its run, whose row that statement's own snapshot does not see.
CREATE POLICY run_data_keys_tenant ON run_data_keys
  USING (current_setting('agentrt.scope', true) = 'work'
         OR tenant_id = current_setting('agentrt.tenant', true))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work'
              OR tenant_id = current_setting('agentrt.tenant', true));
ALTER TABLE run_data_keys ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
