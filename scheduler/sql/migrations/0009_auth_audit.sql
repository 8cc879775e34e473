-- 0009: API keys and the append-only audit trail (docs/design.md §security).
--
-- A key is shown once, at creation; only the SHA-256 of its secret part is
-- kept. `tenants` lists the tenants the key may act for ('*' = every tenant,
-- admin keys only). Expiry and revocation are judged by the database clock.
CREATE TABLE api_keys (
  id uuid PRIMARY KEY,
  name text NOT NULL,
  tenants text[] NOT NULL,
  role text NOT NULL CHECK (role IN ('viewer', 'submitter', 'operator', 'admin')),
  secret_hash bytea NOT NULL CHECK (length(secret_hash) = 32),
  created_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  expires_at timestamptz,
  revoked_at timestamptz,
  revoked_by text,
  CHECK (cardinality(tenants) >= 1),
  CHECK (role = 'admin' OR (cardinality(tenants) = 1 AND tenants[1] <> '*')),
  CHECK (expires_at IS NULL OR expires_at > created_at),
  CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);

CREATE INDEX api_keys_created_idx ON api_keys (created_at, id);

-- One row per operator action, written in the transaction of the action it
-- records (a refused or failed action writes none). Nobody updates, deletes
-- or truncates it: the triggers below refuse it for every role, the owner
-- included, until a retention job is given its own way in.
CREATE TABLE audit_log (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  audit_id uuid NOT NULL UNIQUE,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  principal text NOT NULL,
  principal_kind text NOT NULL CHECK (principal_kind IN ('api_key', 'jwt', 'anonymous', 'local')),
  tenant_id text NOT NULL,
  action text NOT NULL,
  run_id uuid,
  step_key text,
  reason text,
  comment text,
  ticket_id text,
  state_before jsonb,
  state_after jsonb,
  evidence jsonb,
  request_id text
);

CREATE INDEX audit_log_tenant_idx ON audit_log (tenant_id, id);
CREATE INDEX audit_log_run_idx ON audit_log (run_id, id) WHERE run_id IS NOT NULL;

CREATE FUNCTION agentrt_audit_is_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP USING ERRCODE = 'AR002';
END;
$$;

CREATE TRIGGER audit_log_no_update_delete BEFORE UPDATE OR DELETE ON audit_log
  FOR EACH ROW EXECUTE FUNCTION agentrt_audit_is_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
  FOR EACH STATEMENT EXECUTE FUNCTION agentrt_audit_is_append_only();
REVOKE UPDATE, DELETE, TRUNCATE ON audit_log FROM PUBLIC;

-- Audit events of actions on no run (key creation and revocation) go through
-- the outbox too, ordered by the key's id in place of a run id: the outbox's
-- run id no longer has to name a run.
ALTER TABLE outbox DROP CONSTRAINT outbox_run_id_fkey;
