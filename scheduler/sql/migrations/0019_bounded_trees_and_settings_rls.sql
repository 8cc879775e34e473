-- 0019: bounded run trees (README: Child runs) and row-level security on the two
-- tables of operator settings that carry a tenant (README: Security).
--
-- A child carries the root of its tree and its depth (the root's children are at
-- 1), set once at insert from its parent's row: SpawnChildren refuses a spawn
-- past max_spawn_depth or past max_descendants_per_root (counted through this
-- index, under an advisory lock on the root) without walking the tree. Neither
-- column changes after insert: they end no HOT update (0004).
ALTER TABLE agent_runs ADD COLUMN root_run_id uuid;
ALTER TABLE agent_runs ADD COLUMN spawn_depth integer NOT NULL DEFAULT 0 CHECK (spawn_depth >= 0);

-- The children made before this migration: from each top-level run down, with no
-- depth limit (a tree is acyclic: a child is inserted after its parent and its
-- parent never changes). A child whose parent retention deleted is its own
-- tree's top: its root is that missing parent, its depth counted from there.
WITH RECURSIVE tree AS (
  SELECT c.id, coalesce(p.id, c.parent_run_id) AS root, 1 AS depth
  FROM agent_runs AS c LEFT JOIN agent_runs AS p ON p.id = c.parent_run_id
  WHERE c.parent_run_id IS NOT NULL AND (p.id IS NULL OR p.parent_run_id IS NULL)
  UNION ALL
  SELECT c.id, tree.root, tree.depth + 1 FROM tree JOIN agent_runs AS c ON c.parent_run_id = tree.id
)
UPDATE agent_runs AS r SET root_run_id = tree.root, spawn_depth = tree.depth
FROM tree WHERE r.id = tree.id;

ALTER TABLE agent_runs ADD CONSTRAINT root_only_for_children CHECK (
  (parent_run_id IS NULL) = (root_run_id IS NULL) AND (parent_run_id IS NULL) = (spawn_depth = 0));

CREATE INDEX agent_runs_root_idx ON agent_runs (root_run_id) WHERE root_run_id IS NOT NULL;

-- flow_limits (0015) and retention_policies (0012) hold operator settings, some
-- of them one tenant's. Under forced row-level security like the tenant tables
-- (0016): a transaction in a tenant's setting reads that tenant's own rows; the
-- work and admin scopes read every row, including the rows of no one tenant
-- (tenant '*': every tenant's default; '' in flow_limits: an agent's or a tool's
-- limit over every tenant), which a tenant's setting never sees. Only the admin
-- scope writes (SetLimit and ClearLimit in admin_tx, `agentrt retention set` and
-- `clear`); neither setting: nothing is read and nothing written.
CREATE POLICY flow_limits_tenant ON flow_limits FOR SELECT
  USING (current_setting('agentrt.scope', true) IN ('work', 'admin')
         OR tenant_id = current_setting('agentrt.tenant', true));
CREATE POLICY flow_limits_admin ON flow_limits
  USING (current_setting('agentrt.scope', true) = 'admin')
  WITH CHECK (current_setting('agentrt.scope', true) = 'admin');

CREATE POLICY retention_policies_tenant ON retention_policies FOR SELECT
  USING (current_setting('agentrt.scope', true) IN ('work', 'admin')
         OR tenant_id = current_setting('agentrt.tenant', true));
CREATE POLICY retention_policies_admin ON retention_policies
  USING (current_setting('agentrt.scope', true) = 'admin')
  WITH CHECK (current_setting('agentrt.scope', true) = 'admin');

ALTER TABLE flow_limits ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
ALTER TABLE retention_policies ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;

-- Every replica overlays every tenant's runtime limits on its settings, from
-- whichever transaction needs them first (a submit's is in its tenant's
-- setting): this one read enters the work scope for its own statement, as
-- agentrt_fair_head does. EXECUTE for the scheduler role alone (`agentrt roles
-- apply`): the readonly role reads flow_limits under the policies above.
CREATE FUNCTION agentrt_flow_limits()
RETURNS TABLE (scope text, tenant_id text, subject text, limit_name text, value text, updated_at timestamptz,
               updated_by text)
LANGUAGE sql STABLE SET agentrt.scope = 'work' AS $$
  SELECT f.scope, f.tenant_id, f.subject, f.limit_name, f.value, f.updated_at, f.updated_by FROM flow_limits AS f
  ORDER BY f.scope, f.tenant_id, f.subject, f.limit_name
$$;
REVOKE EXECUTE ON FUNCTION agentrt_flow_limits() FROM PUBLIC;
