-- 0015: flow limits changeable at run time (README: Flow control, "Changing limits at run time").
--
-- One row overrides one setting of the scheduler's config for every replica:
--   scope 'tenant': tenant_id a tenant, or '*' for every tenant without a row of
--                   its own (the max_*_per_tenant settings); subject ''.
--                   limit_name weight | max_queued_runs | max_submits_per_s | max_running.
--   scope 'agent':  tenant_id '', subject the agent; limit_name max_running.
--   scope 'tool':   subject the tool; tenant_id '' for every tenant's calls together,
--                   or a tenant for that tenant's calls of it; limit_name rate | concurrency.
-- value is the setting's text ("3", "1.5", "50/s"), checked by SetLimit. Replicas
-- read the table at most every limits_refresh_ms (and the one that wrote a
-- change at once); a row wins over the config file. Written only through
-- RunService SetLimit / ClearLimit, each audited in the same transaction.
CREATE TABLE flow_limits (
  scope text NOT NULL CHECK (scope IN ('tenant', 'agent', 'tool')),
  tenant_id text NOT NULL DEFAULT '' CHECK (length(tenant_id) <= 200),
  subject text NOT NULL DEFAULT '' CHECK (length(subject) <= 200),
  limit_name text NOT NULL CHECK (limit_name IN ('weight', 'max_queued_runs', 'max_submits_per_s', 'max_running',
                                                 'rate', 'concurrency')),
  value text NOT NULL CHECK (length(value) BETWEEN 1 AND 40),
  updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_by text NOT NULL,
  PRIMARY KEY (scope, tenant_id, subject, limit_name),
  CONSTRAINT flow_limit_shape CHECK (
    (scope = 'tenant' AND tenant_id <> '' AND subject = ''
       AND limit_name IN ('weight', 'max_queued_runs', 'max_submits_per_s', 'max_running'))
    OR (scope = 'agent' AND tenant_id = '' AND subject <> '' AND limit_name = 'max_running')
    OR (scope = 'tool' AND subject <> '' AND limit_name IN ('rate', 'concurrency')))
);
