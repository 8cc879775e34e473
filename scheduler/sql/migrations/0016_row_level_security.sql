-- Row-level security on every table that carries a tenant's rows (README,
-- Security). Two transaction- or session-level settings decide what a
-- statement may see and write:
--
--   agentrt.tenant  the caller's tenant, set by RunService paths with
--                   set_config(..., true) in the transaction that reads or
--                   writes (scheduler/store_core.py, tenant_tx);
--   agentrt.scope   'work' for the cross-tenant work path (claims, leases,
--                   checkpoints, the relay, the background tasks), set on
--                   the connections of their own pools; 'admin' for the
--                   audited operator reads of the audit trail (admin_tx).
--
-- Neither set: no row is visible and no row can be written (fail closed).
-- FORCE makes the table owner obey the policies too; superusers and roles
-- with BYPASSRLS still bypass them (the runtime roles are NOBYPASSRLS).
--
-- Tables with a tenant_id column compare it with the setting; the ledger,
-- checkpoints and journal hold their run's id only, and follow their run.

CREATE POLICY agent_runs_tenant ON agent_runs
  USING (current_setting('agentrt.scope', true) = 'work'
         OR tenant_id = current_setting('agentrt.tenant', true))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work'
              OR tenant_id = current_setting('agentrt.tenant', true));

CREATE POLICY outbox_tenant ON outbox
  USING (current_setting('agentrt.scope', true) = 'work'
         OR tenant_id = current_setting('agentrt.tenant', true))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work'
              OR tenant_id = current_setting('agentrt.tenant', true));

-- The admin scope (admin_tx: key management, runtime limits) writes the audit
-- row of its change and that row's event, which may be every tenant's ("*")
-- or several tenants' (a key's); it inserts audit events and nothing else,
-- and reads no event.
CREATE POLICY outbox_admin_audit ON outbox FOR INSERT
  WITH CHECK (current_setting('agentrt.scope', true) = 'admin' AND event_type LIKE 'agent.audit.%');

CREATE POLICY outbox_parked_tenant ON outbox_parked
  USING (current_setting('agentrt.scope', true) = 'work'
         OR tenant_id = current_setting('agentrt.tenant', true))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work'
              OR tenant_id = current_setting('agentrt.tenant', true));

CREATE POLICY run_signals_tenant ON run_signals
  USING (current_setting('agentrt.scope', true) = 'work'
         OR tenant_id = current_setting('agentrt.tenant', true))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work'
              OR tenant_id = current_setting('agentrt.tenant', true));

CREATE POLICY agent_schedules_tenant ON agent_schedules
  USING (current_setting('agentrt.scope', true) = 'work'
         OR tenant_id = current_setting('agentrt.tenant', true))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work'
              OR tenant_id = current_setting('agentrt.tenant', true));

-- The audit trail: also readable (and writable: key management) in the admin scope.
CREATE POLICY audit_log_tenant ON audit_log
  USING (current_setting('agentrt.scope', true) IN ('work', 'admin')
         OR tenant_id = current_setting('agentrt.tenant', true))
  WITH CHECK (current_setting('agentrt.scope', true) IN ('work', 'admin')
              OR tenant_id = current_setting('agentrt.tenant', true));

-- Whether run_id is a run of the transaction's tenant: a function, not an EXISTS
-- in the policies, so that the statements of the work path (which never get
-- past the scope test) do not plan a subquery per child table they touch.
-- Runs as its caller: agent_runs' own policy applies inside too.
CREATE FUNCTION agentrt_tenant_run(of_run uuid) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT EXISTS (SELECT 1 FROM agent_runs AS r
                 WHERE r.id = of_run AND r.tenant_id = current_setting('agentrt.tenant', true))
$$;

CREATE POLICY agent_checkpoints_tenant ON agent_checkpoints
  USING (current_setting('agentrt.scope', true) = 'work' OR agentrt_tenant_run(run_id))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work' OR agentrt_tenant_run(run_id));

CREATE POLICY tool_executions_tenant ON tool_executions
  USING (current_setting('agentrt.scope', true) = 'work' OR agentrt_tenant_run(run_id))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work' OR agentrt_tenant_run(run_id));

CREATE POLICY run_journal_tenant ON run_journal
  USING (current_setting('agentrt.scope', true) = 'work' OR agentrt_tenant_run(run_id))
  WITH CHECK (current_setting('agentrt.scope', true) = 'work' OR agentrt_tenant_run(run_id));

ALTER TABLE agent_runs ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_checkpoints ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE tool_executions ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE run_journal ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE outbox ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE outbox_parked ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE run_signals ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_schedules ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;

-- A submit joins the fair-share queue at the ready head of its priority over
-- every tenant (0013): the one cross-tenant read of the submit path, a single
-- number, read in the work scope for the length of this call only.
CREATE FUNCTION agentrt_fair_head(at_priority integer) RETURNS float8
LANGUAGE sql STABLE SET agentrt.scope = 'work' AS $$
  SELECT h.fair_pass FROM agent_runs AS h
  WHERE h.status = 'QUEUED' AND h.claim_ready AND h.priority = at_priority
  ORDER BY h.priority DESC, h.fair_pass, h.enqueued_at, h.id LIMIT 1
$$;

-- Retention decides by itself what expired, over every tenant: its statements
-- run in the work scope (as the owner, FORCE applies to it too).
ALTER FUNCTION agentrt_retention_purge(integer, boolean, timestamptz, uuid) SET agentrt.scope = 'work';
