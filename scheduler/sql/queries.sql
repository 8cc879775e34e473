-- agentrt scheduler: every runtime query, as named blocks.
-- Format: `-- name: <name>` then comment lines saying which invariant the
-- query guards (cited as sections of docs/design.md), then the statement.
-- Parameters are `:name` (rewritten once at load to $1..$n, a name used twice
-- is one parameter; `::type` is a cast); `{fragment}` includes a
-- `-- fragment:` block below. Parsed once at import by scheduler/store/queries.py
-- (shared/db.py). Lease predicates always use clock_timestamp(): the database
-- clock decides.

-- fragment: live_lease
-- The caller holds the run's lease (owner and fencing token), live by database
-- time (docs/design.md §leases-and-fencing). `r` is the run row.
r.id = :run_id AND r.lease_owner = :worker_id AND r.fencing_token = :fencing_token
  AND r.lease_expires_at > clock_timestamp()

-- fragment: fenced_guard
-- The fenced-write guard, the one predicate every write of a lease holder
-- matches (docs/design.md §invariants, rule 2): a live lease of this owner and fence,
-- the run in a status the write may start from (:allowed_statuses, the
-- transition table's sources of the write), no cancel flagged (a flagged
-- cancel matches no row; the holder's write then ends the run).
{live_lease}
  AND r.status = ANY(:allowed_statuses::text[])
  AND r.cancel_requested_at IS NULL

-- fragment: fenced_cas
-- The fenced-write guard plus compare-and-set on the version the caller read.
{fenced_guard}
  AND r.version = :expected_version

-- fragment: open_step
-- The run waits on step :step_key, whose ledger row is still OUTBOUND_INTENT
-- (docs/design.md §tool-calls). The status is compared through a one-time
-- subquery, not a constant: with the constant, a set form's generic plan made
-- on a young database reads every open row of every run through the partial
-- tool_executions_reconcile_idx instead of probing (run_id, step_key) per run
-- (test_query_plans.py).
r.current_step_key = :step_key
  AND EXISTS (SELECT 1 FROM tool_executions AS te
              WHERE te.run_id = r.id AND te.step_key = :step_key
                AND te.status = (SELECT 'OUTBOUND_INTENT'::text))

-- fragment: journal_continues
-- The entries a write appends continue the run's journal: first seq =
-- journal_length + 1 (docs/design.md §journal; consecutive: checked by the
-- service), or there are none.
(cardinality(:journal_seqs::bigint[]) = 0 OR (:journal_seqs::bigint[])[1] = r.journal_length + 1)

-- fragment: journal_insert
-- The CTE appending those entries (parallel arrays, possibly empty) under the
-- fence and version the `run` CTE wrote.
journal AS (
  INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version)
  SELECT run.id, e.seq, e.kind, e.step_key, e.node, e.tool, e.detail::jsonb, run.fencing_token, run.version
  FROM run, unnest(:journal_seqs::bigint[], :journal_kinds::text[], :journal_step_keys::text[],
                   :journal_nodes::text[], :journal_tools::text[],
                   :journal_details::text[]) AS e(seq, kind, step_key, node, tool, detail)
)

-- fragment: set_item_head
-- A set form's element row `i` (the unnested arrays that follow, WITH
-- ORDINALITY as n): its columns, the write's source statuses and the seqs of
-- its journal entries (those of :journal_* whose :journal_items is n).
SELECT i.*, :allowed_statuses::text[] AS allowed_statuses,
       ARRAY(SELECT e.seq FROM unnest(:journal_items::bigint[], :journal_seqs::bigint[]) AS e(item, seq)
             WHERE e.item = i.n ORDER BY e.seq) AS journal_seqs

-- fragment: journal_insert_set
-- journal_insert for a set form: each element's entries (the elements of
-- :journal_* whose :journal_items is its ordinal) under the fence and version
-- the `run` CTE wrote for that element (`run.n`).
journal AS (
  INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version)
  SELECT run.id, e.seq, e.kind, e.step_key, e.node, e.tool, e.detail::jsonb, run.fencing_token, run.version
  FROM run JOIN unnest(:journal_items::bigint[], :journal_seqs::bigint[], :journal_kinds::text[],
                       :journal_step_keys::text[], :journal_nodes::text[], :journal_tools::text[],
                       :journal_details::text[]) AS e(item, seq, kind, step_key, node, tool, detail)
       ON e.item = run.n
)

-- fragment: close_ledger_set
-- A set form's Tx2 closes each written run's open ledger row with its
-- definite outcome (`written`: the run CTE joined with its element, holding
-- open_status = 'OUTBOUND_INTENT' as a column: with the constant, the planner
-- of a young database reads every open row through the partial
-- tool_executions_reconcile_idx instead of probing (run_id, step_key) per run;
-- test_query_plans.py).
execution AS (
  UPDATE tool_executions AS te
  SET status = w.outcome, response_json = w.response, remote_resource_id = w.remote_resource_id,
      error_code = w.error_code, completed_at = clock_timestamp(),
      reconciliation_evidence = COALESCE(w.evidence, te.reconciliation_evidence),
      reconciled_at = CASE WHEN w.evidence IS NULL THEN te.reconciled_at ELSE clock_timestamp() END
  FROM written AS w
  WHERE te.run_id = w.id AND te.step_key = w.step_key AND te.status = w.open_status
  RETURNING te.id
)

-- name: server_now
-- The database clock, for callers that must report time (never the worker's clock).
SELECT clock_timestamp() AS now;

-- name: primary_probe
-- Health (scheduler/server.py): true when this session's server is a primary that takes writes
-- (a standby, or a session left on a demoted node, answers false; docs/ha.md).
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable;

-- name: set_tenant
-- Row-level security (0016_row_level_security.sql): this transaction sees and
-- writes :tenant_id's rows alone (is_local: gone at COMMIT or ROLLBACK).
SELECT set_config('agentrt.tenant', :tenant_id, true);

-- name: set_scope
-- A row-level security scope for this transaction alone ('admin': the audit trail of every tenant).
SELECT set_config('agentrt.scope', :scope, true);

-- name: row_security_state
-- At start: whether this connection's role escapes row-level security
-- (0016_row_level_security.sql): a superuser or BYPASSRLS role skips the
-- policies, the tables' owner (or a member of its role) may drop them.
SELECT r.rolsuper OR r.rolbypassrls AS bypasses, pg_has_role(current_user, c.relowner, 'MEMBER') AS owns,
       current_user AS who
FROM pg_roles AS r, pg_class AS c
WHERE r.rolname = current_user AND c.oid = 'agent_runs'::regclass;

-- name: submit_run
-- One statement: the run and its submitted event commit together. Its
-- fair-share pass is its tenant's newest queued pass at its priority plus
-- :fair_step (1/the tenant's weight), or that priority's ready head when that
-- is further on (a tenant without a backlog joins at the head), each one index
-- probe (0013_fair_share.sql). The head is read only when it can matter: when
-- the tenant's newest queued run is ready to claim, the head (the lowest pass
-- of the ready runs) is at or below that run's pass, so the newest pass plus
-- the step is already the greater. Two concurrent submits of a tenant may
-- share a pass (then enqueue order decides). A repeated
-- (tenant, client_request_id) inserts nothing. Claimers are woken afterwards by
-- a coalesced NOTIFY (scheduler/background/notifier.py): a NOTIFY inside every submit's
-- transaction would serialise their commits on the notification queue lock.
WITH inserted AS (
  INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts,
                          budget_max_steps, budget_max_tokens, budget_max_cost_usd, deadline_at,
                          client_request_id, submit_hash, next_attempt_at, priority, concurrency_key,
                          concurrency_max, retry_of_run_id, fair_pass)
  VALUES (:run_id, :tenant_id, :agent_name, :agent_version, :input, :labels, :max_attempts, :max_steps,
          :max_tokens, :max_cost_usd, :deadline_at, :client_request_id, :submit_hash, clock_timestamp(),
          :priority, :concurrency_key, :concurrency_max, :retry_of_run_id::uuid,
          -- The run's fair-share pass (migration 0013): 0 with fair share off.
          CASE WHEN :fair_step::float8 > 0 THEN (
            SELECT CASE WHEN bool_or(newest.claim_ready) THEN max(newest.fair_pass) + :fair_step
                        -- Every tenant's head: read in the work scope by the function
                        -- (0016_row_level_security.sql, 0021_fair_head_cached.sql).
                        ELSE greatest(coalesce(max(newest.fair_pass), 0) + :fair_step,
                                      agentrt_fair_head(:priority)) END
            FROM (SELECT q.fair_pass, q.claim_ready FROM agent_runs AS q
                  WHERE q.tenant_id = :tenant_id AND q.priority = :priority AND q.status = 'QUEUED'
                  ORDER BY q.fair_pass DESC LIMIT 1) AS newest) ELSE 0 END)
  ON CONFLICT (tenant_id, client_request_id) WHERE client_request_id IS NOT NULL DO NOTHING
  RETURNING *
), keyed AS (
  -- Marks, once, that runs with concurrency keys exist: claimers then use claim_work.
  INSERT INTO runtime_counters (name, value)
  SELECT 'concurrency_keys_used', 1 FROM inserted WHERE inserted.concurrency_key IS NOT NULL LIMIT 1
  ON CONFLICT (name) DO NOTHING
), sealed AS (
  -- The run's wrapped data key, when its agent marks sensitive fields (0017_sensitive_values.sql).
  INSERT INTO run_data_keys (run_id, tenant_id, key_id, wrapped_key, sensitive)
  SELECT id, tenant_id, :key_id, :wrapped_key, :sensitive FROM inserted WHERE :key_id::text IS NOT NULL
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, traceparent, tracestate)
  SELECT :event_id, id, tenant_id, 'agent.run_submitted',
         jsonb_build_object('agent_name', agent_name, 'agent_version', agent_version,
                            'client_request_id', client_request_id),
         :traceparent, :tracestate
  FROM inserted
)
SELECT inserted.* FROM inserted;

-- name: lock_tenant_submits
-- Serialises one tenant's quota-checked submits until the transaction ends, so
-- two of them never pass a quota on the same count (other tenants do not wait).
SELECT pg_advisory_xact_lock(1095914566, hashtext(:tenant_id));

-- name: submit_quota
-- The counts a tenant's quotas are judged on, read under lock_tenant_submits,
-- each bounded by its limit (:max_queued, :max_rate; 0 reads nothing): QUEUED
-- runs (agent_runs_tenant_status_idx), and submits in the last second by
-- database time (agent_runs_tenant_created_idx) with how long until the oldest
-- of the newest :max_rate leaves the window.
WITH recent AS (
  SELECT created_at FROM agent_runs
  WHERE tenant_id = :tenant_id AND created_at > clock_timestamp() - interval '1 second'
  ORDER BY created_at DESC
  LIMIT :max_rate
)
SELECT
  (SELECT count(*) FROM (SELECT 1 FROM agent_runs WHERE tenant_id = :tenant_id AND status = 'QUEUED'
                         LIMIT :max_queued) AS q) AS queued,
  (SELECT count(*) FROM recent) AS recent,
  extract(epoch FROM (SELECT min(created_at) FROM recent) + interval '1 second' - clock_timestamp())::float8
    AS rate_retry_s;

-- name: get_run_by_client_request
SELECT * FROM agent_runs WHERE tenant_id = :tenant_id AND client_request_id = :client_request_id;

-- name: get_run
-- Tenant-scoped read: another tenant's run is indistinguishable from none. With the trace
-- context of its latest event (outbox_run_idx, read backwards: one index probe).
SELECT r.*, (SELECT o.traceparent FROM outbox o WHERE o.run_id = r.id ORDER BY o.id DESC LIMIT 1)
         AS last_traceparent
FROM agent_runs r WHERE r.id = :run_id AND r.tenant_id = :tenant_id;

-- name: list_runs
-- Keyset pagination on (created_at, id), newest first, within one tenant. A NULL
-- filter is no filter; :labels (a JSON object) matches runs holding each of its
-- key=value pairs (agent_runs_labels_idx, 0020); created_after inclusive, created_before not.
SELECT * FROM agent_runs
WHERE tenant_id = :tenant_id
  AND (:statuses::text[] IS NULL OR status = ANY(:statuses::text[]))
  AND (:agent_name::text IS NULL OR agent_name = :agent_name)
  AND (:labels::jsonb IS NULL OR labels @> :labels::jsonb)
  AND (:min_priority::int IS NULL OR priority >= :min_priority::int)
  AND (:max_priority::int IS NULL OR priority <= :max_priority::int)
  AND (:created_after::timestamptz IS NULL OR created_at >= :created_after::timestamptz)
  AND (:created_before::timestamptz IS NULL OR created_at < :created_before::timestamptz)
  AND (:after_created_at::timestamptz IS NULL OR (created_at, id) < (:after_created_at, :after_id::uuid))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- fragment: live_leased
-- Run `l` holds a concurrency slot: leased (an owner: only the leased statuses
-- have one), its lease live by database time. Matches the agent_leased_* indexes.
l.lease_owner IS NOT NULL AND l.lease_expires_at > clock_timestamp()

-- fragment: limits_of
-- The tenant and agent concurrency limits of run `c` (0 = none): :tenant_max_default
-- unless :limit_tenants/:limit_tenant_max name its tenant; :limit_agents/:limit_agent_max.
coalesce((SELECT t.m FROM unnest(:limit_tenants::text[], :limit_tenant_max::int[]) AS t(n, m)
          WHERE t.n = c.tenant_id LIMIT 1), :tenant_max_default::int) AS tenant_max,
coalesce((SELECT a.m FROM unnest(:limit_agents::text[], :limit_agent_max::int[]) AS a(n, m)
          WHERE a.n = c.agent_name LIMIT 1), 0) AS agent_max

-- fragment: blocked_by
-- Which limit of candidate `c` (with its tenant_max, agent_max) is full, NULL when
-- none: a limit is full when its group already has that many live leased runs,
-- counted through the group's leased-run index (a group holds about its limit
-- of leased rows: a LIMIT here would invite a sequential scan hoping to stop early).
CASE
  WHEN c.tenant_max > 0 AND (SELECT count(*) FROM agent_runs AS l
        WHERE l.tenant_id = c.tenant_id AND {live_leased}) >= c.tenant_max THEN 'tenant'
  WHEN c.agent_max > 0 AND (SELECT count(*) FROM agent_runs AS l
        WHERE l.agent_name = c.agent_name AND {live_leased}) >= c.agent_max THEN 'agent'
  WHEN c.concurrency_key IS NOT NULL AND (SELECT count(*) FROM agent_runs AS l
        WHERE l.tenant_id = c.tenant_id AND l.agent_name = c.agent_name AND l.concurrency_key = c.concurrency_key
          AND {live_leased}) >= c.concurrency_max THEN 'key'
END

-- fragment: claim_take
-- The CTEs `candidate` and `claimed` of both claim statements: the lapsed run
-- (`expired`) first, else the queued one (`queued`); UNION ALL without ORDER BY
-- yields `expired` first and LIMIT 1 stops before `queued` is scanned when an
-- expired run was found. The claim grows the fence; attempt_count counts
-- claims from QUEUED only; a WAITING_TOOL run stays WAITING_TOOL.
candidate AS (
  (SELECT id, false AS from_queue FROM expired UNION ALL SELECT id, true FROM queued) LIMIT 1
), claimed AS (
  UPDATE agent_runs AS r
  SET status = CASE WHEN r.status = 'QUEUED' THEN 'RUNNING' ELSE r.status END,
      lease_owner = :worker_id,
      lease_expires_at = clock_timestamp() + make_interval(secs => :lease_ms::double precision / 1000),
      fencing_token = r.fencing_token + 1,
      attempt_count = CASE WHEN r.status = 'QUEUED' THEN r.attempt_count + 1 ELSE r.attempt_count END,
      awaiting_signal = NULL, waiting_on = NULL, awaiting_join = false,
      updated_at = clock_timestamp()
  FROM candidate AS c
  WHERE r.id = c.id
  RETURNING r.*, c.from_queue
)

-- fragment: claim_answer
-- The one row a claim statement answers: how many runs it woke, parked and
-- looked at, the claimed run (NULLs when none) with its limits, how long a run
-- taken from the queue waited since it was last due (claim_wait_s: since its
-- submit, the end of its wait, or its last limit recheck; NULL for a lapsed
-- lease taken over), the advisory
-- locks of its limited groups (taken here, in a fixed order: tenant, agent,
-- key), its checkpoint, its current step's ledger row, and its pending signals
-- (oldest 100) with the seq of the latest one it received, both read in this
-- statement's snapshot (run_signals_pending_idx): a signal committed after it
-- shows as last_signal_seq on the run row only, which FinishRun then compares
-- with signals_seen (docs/design.md §signals). Needs the CTEs
-- woken, parked, judged and limited (claimed plus its tenant_max, agent_max).
SELECT claimed.*, clock_timestamp() AS db_now, w.woken,
       CASE WHEN claimed.from_queue
            THEN extract(epoch FROM clock_timestamp() - claimed.next_attempt_at)::float8 END AS claim_wait_s,
       (SELECT count(*) FROM parked) AS parked, (SELECT count(*) FROM judged) AS looked,
       (SELECT count(*) FROM (
          SELECT pg_advisory_xact_lock(g.ns, g.h) FROM (
            SELECT 1 AS ord, 1095914567 AS ns, hashtext(claimed.tenant_id) AS h WHERE claimed.tenant_max > 0
            UNION ALL
            SELECT 2, 1095914568, hashtext(claimed.agent_name) WHERE claimed.agent_max > 0
            UNION ALL
            SELECT 3, 1095914569, hashtext(claimed.tenant_id || '/' || claimed.agent_name || '/'
                                           || claimed.concurrency_key)
            WHERE claimed.concurrency_key IS NOT NULL
            ORDER BY ord) AS g) AS locked) AS slot_locks,
       cp.version AS cp_version, cp.state_json AS cp_state_json, cp.state_hash AS cp_state_hash,
       cp.schema_version AS cp_schema_version, cp.fencing_token AS cp_fencing_token,
       cp.event_id AS cp_event_id, cp.created_at AS cp_created_at,
       te.id AS te_id, te.step_key AS te_step_key, te.tool_name AS te_tool_name,
       te.idempotency_key AS te_idempotency_key, te.request_json AS te_request_json,
       te.request_hash AS te_request_hash, te.status AS te_status,
       te.remote_resource_id AS te_remote_resource_id, te.response_json AS te_response_json,
       te.error_code AS te_error_code, te.fencing_token AS te_fencing_token,
       te.outbound_intent_at AS te_outbound_intent_at, te.completed_at AS te_completed_at,
       te.reconciled_at AS te_reconciled_at, te.reconciliation_evidence AS te_reconciliation_evidence,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                 'seq', s.id, 'signal_id', s.signal_id, 'name', s.name, 'payload', s.payload,
                 'received_at', s.received_at, 'request_id', s.request_id) ORDER BY s.id), '[]'::jsonb)
          FROM (SELECT * FROM run_signals WHERE run_id = claimed.id AND consumed_at IS NULL
                ORDER BY id LIMIT 100) AS s) AS pending_signals,
       (SELECT coalesce(max(id), 0) FROM run_signals WHERE run_id = claimed.id) AS signals_seen,
       -- Whether the run holds a data key (written with the run, never later): when not, the
       -- scheduler knows at once that it has nothing sealed to open (scheduler/store/keys.py).
       EXISTS (SELECT 1 FROM run_data_keys AS k WHERE k.run_id = claimed.id) AS has_data_key
FROM (SELECT count(*) AS woken FROM woken) AS w
LEFT JOIN limited AS claimed ON true
LEFT JOIN agent_checkpoints AS cp ON cp.run_id = claimed.id AND cp.version = claimed.version
LEFT JOIN tool_executions AS te ON te.run_id = claimed.id AND te.step_key = claimed.current_step_key

-- name: claim_work
-- Takes one run for worker :worker_id: first a RUNNING/WAITING_TOOL run whose lease
-- lapsed by database time, else a QUEUED run that is due, in claim order:
-- highest priority first, then the lowest fair-share pass (tenants interleaved
-- by weight, 0013_fair_share.sql), then the earliest enqueued_at (the run's
-- first enqueue; pass and enqueued_at are kept across its waits: a run back
-- from a sleep, approval or backoff is not overtaken by fresh submissions). Either kind is taken only
-- when none of its concurrency limits is full ({blocked_by}). FOR UPDATE SKIP
-- LOCKED: two claimers never take the same row. The fencing token grows on
-- every claim; attempt_count only when claimed from QUEUED. A WAITING_TOOL run
-- stays WAITING_TOOL (its new holder may look up or freeze, never resend).
-- `waking` turns up to :wake_batch due, not yet ready runs ready (any agent's:
-- a flag, not a claim). They are claimable from the next statement on, so a
-- statement that woke runs takes no queued run (it would be chosen without
-- them); `woken` tells the caller to claim again.
-- Each path looks at its first :lookahead runs in order (unlocked), judges
-- their limits and locks the first free one it can; queued runs found blocked
-- are parked for :recheck_ms (`parked`: out of the ready index, their
-- enqueued_at kept), so the next claim looks past them. The claimed run's
-- limited groups are locked (advisory, transaction scope, in a fixed order)
-- before the statement ends: the caller's slot_overflow, a new snapshot in the
-- same transaction, then sees every claim that committed before it
-- (store/work.py rolls back a claim that would pass a limit). With the run
-- come its pending signals (see the claim_answer fragment).
WITH waking AS (
  SELECT id FROM agent_runs
  WHERE status = 'QUEUED' AND NOT claim_ready AND next_attempt_at <= clock_timestamp()
  ORDER BY next_attempt_at
  LIMIT :wake_batch
  FOR UPDATE SKIP LOCKED
), woken AS (
  UPDATE agent_runs AS r SET claim_ready = true
  FROM waking AS w
  WHERE r.id = w.id
  RETURNING r.id
), expired_look AS (
  SELECT c.*, {limits_of} FROM (
    SELECT id, tenant_id, agent_name, concurrency_key, concurrency_max, lease_expires_at, created_at
    FROM agent_runs
    WHERE status IN ('RUNNING', 'WAITING_TOOL') AND lease_expires_at < clock_timestamp()
      AND agent_name = ANY(:agents::text[])
    ORDER BY lease_expires_at, created_at, id
    LIMIT :lookahead) AS c
), expired AS (
  SELECT r.id FROM agent_runs AS r
  JOIN expired_look AS c ON c.id = r.id AND ({blocked_by}) IS NULL
  WHERE r.status IN ('RUNNING', 'WAITING_TOOL') AND r.lease_expires_at < clock_timestamp()
  ORDER BY c.lease_expires_at, c.created_at, c.id
  LIMIT 1
  FOR UPDATE OF r SKIP LOCKED
), looked AS (
  SELECT c.*, {limits_of} FROM (
    SELECT id, tenant_id, agent_name, concurrency_key, concurrency_max, priority, fair_pass, enqueued_at
    FROM agent_runs
    WHERE status = 'QUEUED' AND claim_ready AND next_attempt_at <= clock_timestamp()
      AND agent_name = ANY(:agents::text[])
      AND NOT EXISTS (SELECT 1 FROM waking)
    ORDER BY priority DESC, fair_pass, enqueued_at, id
    LIMIT :lookahead) AS c
), judged AS (
  SELECT c.id, c.priority, c.fair_pass, c.enqueued_at, {blocked_by} AS blocked_by FROM looked AS c
), queued AS (
  SELECT r.id FROM agent_runs AS r
  JOIN judged AS j ON j.id = r.id AND j.blocked_by IS NULL
  WHERE r.status = 'QUEUED' AND r.claim_ready
  ORDER BY j.priority DESC, j.fair_pass, j.enqueued_at, j.id
  LIMIT 1
  FOR UPDATE OF r SKIP LOCKED
), to_park AS (
  SELECT r.id, j.blocked_by FROM agent_runs AS r
  JOIN judged AS j ON j.id = r.id AND j.blocked_by IS NOT NULL
  WHERE r.status = 'QUEUED' AND r.claim_ready
  FOR UPDATE OF r SKIP LOCKED
), parked AS (
  UPDATE agent_runs AS r
  SET claim_ready = false, waiting_on = p.blocked_by,
      next_attempt_at = clock_timestamp() + make_interval(secs => :recheck_ms::double precision / 1000)
  FROM to_park AS p
  WHERE r.id = p.id
  RETURNING r.id
), {claim_take}, limited AS (
  SELECT c.*, {limits_of} FROM claimed AS c
)
{claim_answer};

-- name: claim_work_plain
-- claim_work where no concurrency limit can apply (no tenant or agent limit is
-- configured): one scan per path straight off its index, LIMIT 1 FOR UPDATE
-- SKIP LOCKED, in the same claim order. A run with a concurrency key is left
-- to claim_work (store/work.py switches once keys are in use), so this
-- statement never passes a limit.
WITH waking AS (
  SELECT id FROM agent_runs
  WHERE status = 'QUEUED' AND NOT claim_ready AND next_attempt_at <= clock_timestamp()
  ORDER BY next_attempt_at
  LIMIT :wake_batch
  FOR UPDATE SKIP LOCKED
), woken AS (
  UPDATE agent_runs AS r SET claim_ready = true
  FROM waking AS w
  WHERE r.id = w.id
  RETURNING r.id
), expired AS (
  SELECT id FROM agent_runs
  WHERE status IN ('RUNNING', 'WAITING_TOOL') AND lease_expires_at < clock_timestamp()
    AND agent_name = ANY(:agents::text[]) AND concurrency_key IS NULL
  ORDER BY lease_expires_at, created_at, id
  LIMIT 1
  FOR UPDATE SKIP LOCKED
), queued AS (
  SELECT id FROM agent_runs
  WHERE status = 'QUEUED' AND claim_ready AND next_attempt_at <= clock_timestamp()
    AND agent_name = ANY(:agents::text[]) AND concurrency_key IS NULL
    AND NOT EXISTS (SELECT 1 FROM waking)
  ORDER BY priority DESC, fair_pass, enqueued_at, id
  LIMIT 1
  FOR UPDATE SKIP LOCKED
), {claim_take}, parked AS (
  SELECT NULL::uuid AS id WHERE false
), judged AS (
  SELECT NULL::uuid AS id WHERE false
), limited AS (
  SELECT c.*, 0 AS tenant_max, 0 AS agent_max FROM claimed AS c
)
{claim_answer};

-- name: slot_overflow
-- After claim_work locked the claimed run's groups, in its transaction (a new
-- snapshot): which limit, if any, the claim passes. Counts live leased runs,
-- the claimed one included (0 = no limit).
SELECT CASE
  WHEN :tenant_max::int > 0 AND (SELECT count(*) FROM agent_runs AS l
        WHERE l.tenant_id = :tenant_id AND {live_leased}) > :tenant_max THEN 'tenant'
  WHEN :agent_max::int > 0 AND (SELECT count(*) FROM agent_runs AS l
        WHERE l.agent_name = :agent_name AND {live_leased}) > :agent_max THEN 'agent'
  WHEN :key_max::int > 0 AND (SELECT count(*) FROM agent_runs AS l
        WHERE l.tenant_id = :tenant_id AND l.agent_name = :agent_name AND l.concurrency_key = :concurrency_key
          AND {live_leased}) > :key_max THEN 'key'
END AS overflow;

-- name: heartbeat
-- Extends a lease only while it is still live by database time: a worker whose
-- lease lapsed cannot revive itself, even if nobody has claimed the run yet.
UPDATE agent_runs AS r
SET lease_expires_at = clock_timestamp() + make_interval(secs => :lease_ms::double precision / 1000),
    updated_at = clock_timestamp()
WHERE {fenced_guard}
RETURNING r.lease_expires_at, r.tenant_id;

-- name: save_checkpoint
-- CAS on (run, owner, fence, version) under a live lease; the version bump,
-- the checkpoint row, the journal entries it records (:journal_*, parallel
-- arrays, possibly empty) and its outbox event commit in this one statement.
-- The entries must continue the run's journal (first seq = journal_length + 1,
-- consecutive: checked by the service), else nothing matches and nothing is written.
-- The signals it consumes (:consume_signal_seqs) are marked with its version and
-- fence, each announced; one already consumed (or another run's) fails the
-- whole statement (agentrt_assert): a signal is consumed exactly once.
WITH run AS (
  UPDATE agent_runs AS r
  SET version = r.version + 1,
      checkpoint_schema_version = :schema_version,
      current_step_key = COALESCE(:step_key, r.current_step_key),
      journal_length = r.journal_length + cardinality(:journal_seqs::bigint[]),
      updated_at = clock_timestamp()
  WHERE {fenced_cas}
    AND {journal_continues}
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token
), {journal_insert}, checkpoint AS (
  INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version,
                                 fencing_token, event_id)
  SELECT id, version, :state, :state_hash, :schema_version, fencing_token, :event_id FROM run
  RETURNING version
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT :event_id, id, tenant_id, :event_type,
         :event_payload::jsonb || jsonb_build_object('version', version, 'step_key', :step_key::text),
         fencing_token, version, :traceparent, :tracestate, :write_op, :write_hash::bytea
  FROM run
), consumed AS (
  UPDATE run_signals AS s
  SET consumed_at = clock_timestamp(), consumed_version = run.version, consumed_fencing_token = run.fencing_token
  FROM run
  WHERE s.run_id = run.id AND s.id = ANY(:consume_signal_seqs::bigint[]) AND s.consumed_at IS NULL
  RETURNING s.id, s.signal_id, s.name
), consumed_event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate)
  SELECT gen_random_uuid(), run.id, run.tenant_id, 'agent.signal_consumed',
         jsonb_build_object('seq', consumed.id, 'signal_id', consumed.signal_id, 'name', consumed.name,
                            'version', run.version, 'step_key', :step_key::text),
         run.fencing_token, run.version, :traceparent, :tracestate
  FROM run, consumed
)
SELECT checkpoint.version, (SELECT tenant_id FROM run) AS tenant_id FROM checkpoint
WHERE agentrt_assert((SELECT count(*) FROM consumed) = cardinality(:consume_signal_seqs::bigint[]),
                     'a signal this checkpoint consumes is consumed already or not the run''s');

-- name: lock_tool_slots
-- Serialises the Tx1s of one tool (:tool_key_1) and of one tenant's calls of it
-- (:tool_key_2, NULL when that pair has no limit of its own) until the
-- transaction ends, in that order: the counts read after it (tool_usage, a new
-- snapshot) then see every intent committed before.
SELECT pg_advisory_xact_lock(1095914570, hashtext(:tool_key_1)),
       CASE WHEN :tool_key_2::text IS NOT NULL THEN pg_advisory_xact_lock(1095914571, hashtext(:tool_key_2)) END;

-- name: tool_usage
-- A tool's use by database time (of :tenant_id's runs only when it is not
-- NULL): intents in the last :window_ms (the newest :rate of them at most,
-- tool_executions_tool_intent_idx) with how long until the oldest of those
-- leaves the window, and its open intents (tool_executions_tool_open_idx).
WITH recent AS (
  SELECT te.outbound_intent_at FROM tool_executions AS te
  WHERE te.tool_name = :tool_name
    AND te.outbound_intent_at > clock_timestamp() - make_interval(secs => :window_ms::double precision / 1000)
    AND (:tenant_id::text IS NULL
         OR EXISTS (SELECT 1 FROM agent_runs AS r WHERE r.id = te.run_id AND r.tenant_id = :tenant_id))
  ORDER BY te.outbound_intent_at DESC
  LIMIT :rate
)
SELECT (SELECT count(*) FROM recent) AS recent,
       extract(epoch FROM (SELECT min(outbound_intent_at) FROM recent)
               + make_interval(secs => :window_ms::double precision / 1000) - clock_timestamp())::float8 AS retry_s,
       (SELECT count(*) FROM tool_executions AS te
        WHERE te.tool_name = :tool_name AND te.status = 'OUTBOUND_INTENT' AND te.completed_at IS NULL
          AND :concurrency::int > 0
          AND (:tenant_id::text IS NULL
               OR EXISTS (SELECT 1 FROM agent_runs AS r WHERE r.id = te.run_id AND r.tenant_id = :tenant_id)))
         AS open;

-- name: run_tenant
SELECT tenant_id FROM agent_runs WHERE id = :run_id;

-- name: begin_tool_call
-- Tx1: records the outbound intent before any network I/O, for one run or for
-- many at once: each element of the parallel arrays below is one run's write
-- (a run at most once), judged alone (`{fenced_cas@i}`), and the ordinal `n` of
-- each row returned says which matched. Refused (no row) unless the current
-- checkpoint already holds this very decision (same step key, tool and request
-- hash: docs/design.md §invariants, rule 6) and no ledger row exists for the
-- step. The run moves to WAITING_TOOL in the same statement. One statement is
-- one transaction: a unique key refused by any run's write (an idempotency key
-- already held) refuses all of them, and the caller then writes each alone.
WITH item AS (
  SELECT i.*, :allowed_statuses::text[] AS allowed_statuses
  FROM unnest(:run_ids::uuid[], :worker_ids::text[], :fencing_tokens::bigint[], :expected_versions::bigint[],
              :step_keys::text[], :tool_names::text[], :idempotency_keys::text[], :requests::jsonb[],
              :request_hashes::bytea[], :legacy_request_hashes::bytea[], :execution_ids::uuid[], :event_ids::uuid[],
              :traceparents::text[], :tracestates::text[], :write_ops::text[], :write_hashes::bytea[])
       WITH ORDINALITY AS i(run_id, worker_id, fencing_token, expected_version, step_key, tool_name,
                            idempotency_key, request, request_hash, legacy_request_hash, execution_id, event_id,
                            traceparent, tracestate, write_op, write_hash, n)
), run AS (
  UPDATE agent_runs AS r
  SET status = 'WAITING_TOOL', current_step_key = i.step_key, updated_at = clock_timestamp()
  FROM item AS i
  WHERE {fenced_cas@i}
    AND EXISTS (
      SELECT 1 FROM agent_checkpoints AS cp
      WHERE cp.run_id = r.id AND cp.version = r.version
        AND cp.state_json -> 'pending_tool' ->> 'step_key' = i.step_key
        AND cp.state_json -> 'pending_tool' ->> 'tool_name' = i.tool_name
        -- either hash form: a decision an executor of an earlier release recorded still matches
        AND cp.state_json -> 'pending_tool' ->> 'request_hash'
            IN (encode(i.request_hash, 'hex'), encode(i.legacy_request_hash, 'hex')))
    AND NOT EXISTS (SELECT 1 FROM tool_executions AS te WHERE te.run_id = r.id AND te.step_key = i.step_key)
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token, i.n
), written AS (
  SELECT run.*, i.step_key, i.tool_name, i.idempotency_key, i.request, i.request_hash, i.execution_id, i.event_id,
         i.traceparent, i.tracestate, i.write_op, i.write_hash
  FROM run JOIN item AS i ON i.n = run.n
), execution AS (
  INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json,
                               request_hash, status, fencing_token, intent_event_id)
  SELECT execution_id, id, step_key, tool_name, idempotency_key, request, request_hash, 'OUTBOUND_INTENT',
         fencing_token, event_id FROM written
  RETURNING *
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT event_id, id, tenant_id, 'agent.tool_requested',
         jsonb_build_object('step_key', step_key, 'tool_name', tool_name,
                            'idempotency_key', idempotency_key, 'execution_id', execution_id),
         fencing_token, version, traceparent, tracestate, write_op, write_hash
  FROM written
)
SELECT execution.*, written.tenant_id, written.n FROM written JOIN execution ON execution.run_id = written.id;

-- name: complete_tool_call
-- Tx2: the tool's definite result, the next checkpoint, the version bump, the
-- return to RUNNING and the event commit together, or nothing does
-- (docs/design.md §invariants, rule 5). The run must be WAITING_TOOL on this step
-- under a live lease with this fence, and the ledger row must still be
-- OUTBOUND_INTENT (asserted: exactly one row). The journal entries the
-- checkpoint records (:journal_*) are appended as in save_checkpoint.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = 'RUNNING', version = r.version + 1, current_step_key = :next_step_key,
      checkpoint_schema_version = :schema_version,
      journal_length = r.journal_length + cardinality(:journal_seqs::bigint[]),
      -- A succeeded step is progress: from here the claim in hand is the next step's first
      -- attempt, so a long run's retries over thousands of steps never add up to max_attempts.
      attempt_count = CASE WHEN :outcome = 'SUCCEEDED' THEN 1 ELSE r.attempt_count END,
      updated_at = clock_timestamp()
  WHERE {fenced_cas}
    AND {open_step}
    AND {journal_continues}
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token
), {journal_insert}, execution AS (
  UPDATE tool_executions AS te
  SET status = :outcome, response_json = :response, remote_resource_id = :remote_resource_id,
      error_code = :error_code, completed_at = clock_timestamp(),
      reconciliation_evidence = COALESCE(:evidence::jsonb, te.reconciliation_evidence),
      reconciled_at = CASE WHEN :evidence::jsonb IS NULL THEN te.reconciled_at ELSE clock_timestamp() END
  FROM run
  WHERE te.run_id = :run_id AND te.run_id = run.id AND te.step_key = :step_key AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
), checkpoint AS (
  INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version,
                                 fencing_token, event_id)
  SELECT id, version, :state, :state_hash, :schema_version, fencing_token, :event_id FROM run
  RETURNING version
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT :event_id, id, tenant_id,
         CASE WHEN :outcome = 'SUCCEEDED' THEN 'agent.tool_succeeded' ELSE 'agent.tool_failed' END,
         jsonb_build_object('step_key', :step_key::text, 'version', version, 'error_code', :error_code::text),
         fencing_token, version, :traceparent, :tracestate, :write_op, :write_hash::bytea
  FROM run
)
SELECT checkpoint.version, (SELECT tenant_id FROM run) AS tenant_id,
       agentrt_assert((SELECT count(*) FROM execution) = 1, 'tool ledger row was not open') AS ok
FROM checkpoint;

-- name: complete_tool_call_and_end
-- Tx2 whose checkpoint records the run's end (the next decision is to finish
-- or fail), for one run or for many at once: each element of the parallel
-- arrays below is one run's write (a run at most once; its journal entries are
-- the elements of :journal_* whose :journal_items is its ordinal, from 1),
-- judged alone, and the ordinal `n` of each row returned says which matched.
-- The definite result, the checkpoint, the end of the run (end_outcome =
-- COMPLETED | FAILED, with result, reason and finished_at, the lease cleared)
-- and both events commit together. Guards as complete_tool_call
-- (`{fenced_cas@i}`, `{open_step@i}`: asserted, one ledger row closes per run
-- written); the journal entries are appended as in save_checkpoint. One
-- statement is one transaction: an assert or unique key refused by any run's
-- write refuses all of them, and the caller then writes each alone.
WITH item AS (
  {set_item_head}
  FROM unnest(:run_ids::uuid[], :worker_ids::text[], :fencing_tokens::bigint[], :expected_versions::bigint[],
              :step_keys::text[], :outcomes::text[], :states::jsonb[], :state_hashes::bytea[],
              :schema_versions::int[], :responses::jsonb[], :remote_resource_ids::text[], :error_codes::text[],
              :evidences::jsonb[], :event_ids::uuid[], :next_step_keys::text[], :end_outcomes::text[],
              :end_results::jsonb[], :end_reasons::text[], :end_error_classes::text[], :end_event_ids::uuid[],
              :traceparents::text[], :tracestates::text[], :write_ops::text[], :write_hashes::bytea[])
       WITH ORDINALITY AS i(run_id, worker_id, fencing_token, expected_version, step_key, outcome, state,
                            state_hash, schema_version, response, remote_resource_id, error_code, evidence,
                            event_id, next_step_key, end_outcome, end_result, end_reason, end_error_class,
                            end_event_id, traceparent, tracestate, write_op, write_hash, n)
), run AS (
  UPDATE agent_runs AS r
  SET status = i.end_outcome, version = r.version + 1, current_step_key = i.next_step_key,
      checkpoint_schema_version = i.schema_version, lease_owner = NULL, lease_expires_at = NULL,
      journal_length = r.journal_length + cardinality(i.journal_seqs),
      result = CASE WHEN i.end_outcome = 'COMPLETED' THEN i.end_result ELSE r.result END,
      terminal_reason = i.end_reason, finished_at = clock_timestamp(), last_event_id = i.end_event_id,
      updated_at = clock_timestamp()
  FROM item AS i
  WHERE {fenced_cas@i}
    AND {open_step@i}
    AND {journal_continues@i}
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token, r.status, r.attempt_count, i.n
), {journal_insert_set}, written AS (
  SELECT run.*, i.step_key, i.outcome, i.state, i.state_hash, i.schema_version, i.response, i.remote_resource_id,
         i.error_code, i.evidence, i.event_id, i.end_reason, i.end_error_class, i.end_event_id, i.traceparent,
         i.tracestate, i.write_op, i.write_hash,
         'OUTBOUND_INTENT'::text AS open_status  -- read by close_ledger_set
  FROM run JOIN item AS i ON i.n = run.n
), {close_ledger_set}, checkpoint AS (
  INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version,
                                 fencing_token, event_id)
  SELECT id, version, state, state_hash, schema_version, fencing_token, event_id FROM written
  RETURNING run_id, version
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT event_id, id, tenant_id,
         CASE WHEN outcome = 'SUCCEEDED' THEN 'agent.tool_succeeded' ELSE 'agent.tool_failed' END,
         jsonb_build_object('step_key', step_key, 'version', version, 'error_code', error_code),
         fencing_token, version, traceparent, tracestate, write_op, write_hash
  FROM written
  UNION ALL
  SELECT end_event_id, id, tenant_id,
         CASE status WHEN 'COMPLETED' THEN 'agent.run_completed' ELSE 'agent.run_failed' END,
         jsonb_build_object('status', status, 'reason', end_reason, 'error_class', end_error_class,
                            'next_attempt_at', NULL, 'attempt_count', attempt_count),
         fencing_token, version, traceparent, tracestate, write_op, write_hash
  FROM written
)
SELECT checkpoint.version, written.tenant_id, written.status, written.n,
       agentrt_assert((SELECT count(*) FROM execution) = (SELECT count(*) FROM run),
                      'tool ledger row was not open') AS ok
FROM written JOIN checkpoint ON checkpoint.run_id = written.id;

-- name: complete_and_begin_tool_call
-- Tx2 of step :step_key and Tx1 of step :next_step_key in one statement, for
-- one run or for many at once: each element of the parallel arrays below is
-- one run's write (a run at most once; its journal entries are the elements
-- of :journal_* whose :journal_items is its ordinal, from 1). Each run's write
-- is judged alone, by the guards complete_tool_call and begin_tool_call apply
-- apart (docs/design.md §tool-calls; rules of §invariants); the ordinal `n` of
-- each row returned says which writes matched, and a write that matched no
-- row wrote nothing:
--   * the fenced-write guard, judged for each element (`{fenced_cas@i}`):
--     fence, owner, version CAS and a live lease by clock_timestamp() (rule 2);
--     a flagged cancel matches no row;
--   * the run is WAITING_TOOL on :step_key whose ledger row is still
--     OUTBOUND_INTENT (asserted: one row closes per run written);
--   * the definite result, the new checkpoint (version + 1) and its event commit
--     together (rule 5);
--   * the new checkpoint's pending_tool records the next call: same step key,
--     tool and request hash (:next_request_hash, computed by the server)
--     (rule 6: the decision is persisted in the very transaction that
--     records its intent, before any network I/O);
--   * no ledger row exists yet for :next_step_key (a row is never a licence to
--     resend); its OUTBOUND_INTENT row and agent.tool_requested event commit
--     with the rest (rule 3), and the run stays WAITING_TOOL on it;
--   * the journal entries the checkpoint records continue the run's journal
--     and are appended with it, as in save_checkpoint.
-- One statement is one transaction: a unique key or an assert refused by any
-- run's write refuses all of them, and the caller then writes each alone.
WITH item AS (
  {set_item_head}
  FROM unnest(:run_ids::uuid[], :worker_ids::text[], :fencing_tokens::bigint[], :expected_versions::bigint[],
              :step_keys::text[], :outcomes::text[], :states::jsonb[], :state_hashes::bytea[],
              :schema_versions::int[], :responses::jsonb[], :remote_resource_ids::text[], :error_codes::text[],
              :evidences::jsonb[], :event_ids::uuid[], :next_step_keys::text[], :next_tool_names::text[],
              :next_idempotency_keys::text[], :next_request_hashes::bytea[],
              :next_legacy_request_hashes::bytea[], :next_execution_ids::uuid[], :next_requests::jsonb[],
              :next_event_ids::uuid[], :traceparents::text[], :tracestates::text[], :write_ops::text[],
              :write_hashes::bytea[])
       WITH ORDINALITY AS i(run_id, worker_id, fencing_token, expected_version, step_key, outcome, state,
                            state_hash, schema_version, response, remote_resource_id, error_code, evidence,
                            event_id, next_step_key, next_tool_name, next_idempotency_key, next_request_hash,
                            next_legacy_request_hash, next_execution_id, next_request, next_event_id,
                            traceparent, tracestate, write_op, write_hash, n)
), run AS (
  UPDATE agent_runs AS r
  SET version = r.version + 1, current_step_key = i.next_step_key, checkpoint_schema_version = i.schema_version,
      journal_length = r.journal_length + cardinality(i.journal_seqs),
      attempt_count = CASE WHEN i.outcome = 'SUCCEEDED' THEN 1 ELSE r.attempt_count END,  -- progress (as above)
      updated_at = clock_timestamp()
  FROM item AS i
  WHERE {fenced_cas@i}
    AND {open_step@i}
    AND NOT EXISTS (SELECT 1 FROM tool_executions AS te WHERE te.run_id = r.id AND te.step_key = i.next_step_key)
    AND i.state -> 'pending_tool' ->> 'step_key' = i.next_step_key
    AND i.state -> 'pending_tool' ->> 'tool_name' = i.next_tool_name
    AND i.state -> 'pending_tool' ->> 'request_hash'
        IN (encode(i.next_request_hash, 'hex'), encode(i.next_legacy_request_hash, 'hex'))
    AND {journal_continues@i}
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token, i.n
), {journal_insert_set}, written AS (
  SELECT run.*, i.step_key, i.outcome, i.state, i.state_hash, i.schema_version, i.response, i.remote_resource_id,
         i.error_code, i.evidence, i.event_id, i.next_step_key, i.next_tool_name, i.next_idempotency_key,
         i.next_request_hash, i.next_execution_id, i.next_request, i.next_event_id, i.traceparent, i.tracestate,
         i.write_op, i.write_hash,
         'OUTBOUND_INTENT'::text AS open_status  -- read by close_ledger_set
  FROM run JOIN item AS i ON i.n = run.n
), {close_ledger_set}, checkpoint AS (
  INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version,
                                 fencing_token, event_id)
  SELECT id, version, state, state_hash, schema_version, fencing_token, event_id FROM written
  RETURNING run_id, version
), intent AS (
  INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json,
                               request_hash, status, fencing_token, intent_event_id)
  SELECT next_execution_id, id, next_step_key, next_tool_name, next_idempotency_key, next_request,
         next_request_hash, 'OUTBOUND_INTENT', fencing_token, next_event_id FROM written
  RETURNING *
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT event_id, id, tenant_id,
         CASE WHEN outcome = 'SUCCEEDED' THEN 'agent.tool_succeeded' ELSE 'agent.tool_failed' END,
         jsonb_build_object('step_key', step_key, 'version', version, 'error_code', error_code),
         fencing_token, version, traceparent, tracestate, write_op, write_hash
  FROM written
  UNION ALL
  SELECT next_event_id, id, tenant_id, 'agent.tool_requested',
         jsonb_build_object('step_key', next_step_key, 'tool_name', next_tool_name,
                            'idempotency_key', next_idempotency_key, 'execution_id', next_execution_id),
         fencing_token, version, traceparent, tracestate, write_op, write_hash
  FROM written
)
SELECT intent.*, checkpoint.version AS cp_version, written.tenant_id, written.n,
       agentrt_assert((SELECT count(*) FROM execution) = (SELECT count(*) FROM run),
                      'tool ledger row was not open') AS ok
FROM written JOIN intent ON intent.run_id = written.id JOIN checkpoint ON checkpoint.run_id = written.id;

-- name: tool_not_executed
-- Takeover: the downstream's lookup proved the request never took effect.
-- The ledger row is closed NOT_EXECUTED with its evidence (never deleted) and
-- the run returns to QUEUED with backoff; its next attempt gets a new step key.
-- At max_attempts the run ends FAILED instead: a retry loop must end somewhere.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = CASE WHEN r.attempt_count >= r.max_attempts THEN 'FAILED' ELSE 'QUEUED' END,
      lease_owner = NULL, lease_expires_at = NULL, claim_ready = false,
      next_attempt_at = clock_timestamp()
        + make_interval(secs => agentrt_backoff_ms(r.id, r.attempt_count, :backoff_base_ms, :backoff_cap_ms,
                                                   :backoff_jitter_ms) / 1000),
      terminal_reason = CASE WHEN r.attempt_count >= r.max_attempts
        THEN 'attempts exhausted (' || r.attempt_count || '/' || r.max_attempts || '): tool not executed'
        ELSE r.terminal_reason END,
      finished_at = CASE WHEN r.attempt_count >= r.max_attempts THEN clock_timestamp() END,
      last_event_id = :event_id, updated_at = clock_timestamp()
  WHERE {fenced_cas}
    AND {open_step}
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token, r.agent_name, r.status
), execution AS (
  UPDATE tool_executions AS te
  SET status = 'NOT_EXECUTED', error_code = :error_code, completed_at = clock_timestamp(),
      reconciled_at = clock_timestamp(), reconciliation_evidence = :evidence, resolved_by = :worker_id
  FROM run
  WHERE te.run_id = :run_id AND te.run_id = run.id AND te.step_key = :step_key AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT :event_id, id, tenant_id, 'agent.tool_not_executed',
         jsonb_build_object('step_key', :step_key::text, 'evidence', :evidence::jsonb, 'status', status),
         fencing_token, version, :traceparent, :tracestate, :write_op, :write_hash::bytea
  FROM run
)
SELECT run.version, run.status, run.tenant_id,
       agentrt_assert((SELECT count(*) FROM execution) = 1, 'tool ledger row was not open') AS ok
FROM run;

-- name: mark_tool_in_doubt
-- Unknown outcome: freeze (docs/design.md §in-doubt). The ledger row becomes
-- IN_DOUBT, the run PAUSED_INDOUBT with its lease cleared, and an event is
-- written, together. No version CAS: the freeze is right at any version.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = 'PAUSED_INDOUBT', lease_owner = NULL, lease_expires_at = NULL,
      -- What the tool said (a python tool's exception type and message, a timeout's detail) goes
      -- into the reason a person reads first: `agentrt runs get`.
      pause_reason = 'tool outcome unknown: ' || :error_code
                     || CASE WHEN :detail::text <> '' THEN ': ' || left(:detail::text, 300) ELSE '' END,
      last_event_id = :event_id,
      updated_at = clock_timestamp()
  WHERE {fenced_guard}
    AND {open_step}
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token
), execution AS (
  UPDATE tool_executions AS te
  SET status = 'IN_DOUBT', error_code = :error_code
  FROM run
  WHERE te.run_id = :run_id AND te.run_id = run.id AND te.step_key = :step_key AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT :event_id, id, tenant_id, 'agent.tool_in_doubt',
         jsonb_build_object('step_key', :step_key::text, 'error_code', :error_code::text, 'detail', :detail::text),
         fencing_token, version, :traceparent, :tracestate, :write_op, :write_hash::bytea
  FROM run
)
SELECT run.version, run.tenant_id,
       agentrt_assert((SELECT count(*) FROM execution) = 1, 'tool ledger row was not open') AS ok
FROM run;

-- fragment: join_met
-- The join recorded on run `r` is met: ANY child of its group ended, or ALL of them.
(r.join_key IS NOT NULL AND ((r.join_mode = 'ANY' AND r.join_done > 0) OR r.join_done >= r.join_total))

-- name: finish_run
-- Ends the holder's turn: COMPLETED / FAILED / PAUSED_HUMAN (:target), or back
-- to QUEUED for a retry with backoff or a durable sleep. A retry at
-- max_attempts goes to :exhausted_status (FAILED or PAUSED_HUMAN) instead. The
-- lease is always cleared (docs/design.md §invariants, rule 1). :mode = 'retry' |
-- 'sleep' | 'end'. Sleep and resume reset attempt_count: it counts claims since
-- the run last made progress on its own terms. A sleep with :wait_signal waits
-- for that signal (the sleep is its timeout): due at once when an unconsumed
-- signal of that name is queued (one probe of run_signals_pending_idx under the
-- row lock SignalRun also takes: one that came after the claim, or one past the
-- claim's first 100), else parked with awaiting_signal set, which a SignalRun of
-- that name clears as it wakes the run. Other signals do not wake it. A sleep
-- with :wait_children waits for the join SpawnChildren recorded on the row: due
-- at once when it is met (join_met, on the row: a child that ended meanwhile
-- counted itself there under this row's lock), else parked with awaiting_join
-- set, which the child-ended trigger (migration 0014) clears as it wakes the run.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = CASE
        WHEN :mode = 'retry' AND r.attempt_count >= r.max_attempts THEN :exhausted_status
        WHEN :mode IN ('retry', 'sleep') THEN 'QUEUED'
        ELSE :target END,
      lease_owner = NULL, lease_expires_at = NULL,
      next_attempt_at = CASE
        WHEN :mode = 'retry' THEN clock_timestamp()
          + make_interval(secs => agentrt_backoff_ms(r.id, r.attempt_count, :backoff_base_ms, :backoff_cap_ms,
                                                     :backoff_jitter_ms) / 1000)
        WHEN :mode = 'sleep' AND :wait_children::boolean AND {join_met} THEN clock_timestamp()
        WHEN :mode = 'sleep' AND :wait_signal::text IS NOT NULL AND EXISTS (
            SELECT 1 FROM run_signals AS sg
            WHERE sg.run_id = r.id AND sg.consumed_at IS NULL AND sg.name = :wait_signal::text)
          THEN clock_timestamp()
        WHEN :mode = 'sleep' THEN clock_timestamp() + make_interval(secs => :sleep_ms::double precision / 1000)
        ELSE r.next_attempt_at END,
      awaiting_signal = CASE WHEN :mode = 'sleep' AND NOT EXISTS (
            SELECT 1 FROM run_signals AS sg
            WHERE sg.run_id = r.id AND sg.consumed_at IS NULL AND sg.name = :wait_signal::text)
          THEN :wait_signal ELSE NULL END,
      awaiting_join = :mode = 'sleep' AND :wait_children::boolean AND NOT {join_met},
      -- A run back in the queue for later waits outside the claim index until due (claim_work wakes it).
      claim_ready = CASE WHEN :mode IN ('retry', 'sleep') THEN false ELSE r.claim_ready END,
      attempt_count = CASE WHEN :mode = 'sleep' THEN 0 ELSE r.attempt_count END,
      result = CASE WHEN :mode = 'end' AND :target = 'COMPLETED' THEN :result::jsonb ELSE r.result END,
      terminal_reason = CASE
        WHEN :mode = 'retry' AND r.attempt_count >= r.max_attempts AND :exhausted_status = 'FAILED'
          THEN 'attempts exhausted (' || r.attempt_count || '/' || r.max_attempts || '): ' || :reason
        WHEN :mode = 'end' AND :target IN ('COMPLETED', 'FAILED') THEN :reason
        ELSE r.terminal_reason END,
      pause_reason = CASE
        WHEN :mode = 'retry' AND r.attempt_count >= r.max_attempts AND :exhausted_status = 'PAUSED_HUMAN'
          THEN 'attempts exhausted (' || r.attempt_count || '/' || r.max_attempts || '): ' || :reason
        WHEN :mode = 'end' AND :target = 'PAUSED_HUMAN' THEN :reason
        WHEN :mode = 'sleep' THEN NULL
        ELSE r.pause_reason END,
      finished_at = CASE
        WHEN (:mode = 'end' AND :target IN ('COMPLETED', 'FAILED'))
          OR (:mode = 'retry' AND r.attempt_count >= r.max_attempts AND :exhausted_status = 'FAILED')
        THEN clock_timestamp() ELSE NULL END,
      last_event_id = :event_id, updated_at = clock_timestamp()
  WHERE {fenced_cas}
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token, r.status, r.next_attempt_at,
            r.attempt_count, r.agent_name, r.awaiting_join
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT :event_id, id, tenant_id,
         CASE status WHEN 'COMPLETED' THEN 'agent.run_completed'
                     WHEN 'FAILED' THEN 'agent.run_failed'
                     WHEN 'PAUSED_HUMAN' THEN 'agent.run_paused'
                     ELSE CASE WHEN :mode = 'sleep' THEN 'agent.run_sleeping' ELSE 'agent.run_retry_scheduled' END
         END,
         jsonb_build_object('status', status, 'reason', :reason::text, 'error_class', :error_class::text,
                            'next_attempt_at', CASE WHEN status = 'QUEUED' THEN next_attempt_at END,
                            'attempt_count', attempt_count, 'awaiting_signal', :wait_signal::text,
                            'awaiting_children', CASE WHEN :wait_children::boolean THEN awaiting_join END),
         fencing_token, version, :traceparent, :tracestate, :write_op, :write_hash::bytea
  FROM run
)
SELECT run.status, run.next_attempt_at, run.version, run.tenant_id FROM run;

-- name: lock_run
-- Operator paths (cancel, resume, resolve) and error diagnosis lock the row
-- first, check the transition table in code, then write.
SELECT *, lease_expires_at > clock_timestamp() AS lease_live, clock_timestamp() AS db_now
FROM agent_runs WHERE id = :run_id FOR UPDATE;

-- name: read_run
-- Unlocked read used to explain why a fenced write matched no row.
SELECT *, lease_expires_at > clock_timestamp() AS lease_live, clock_timestamp() AS db_now
FROM agent_runs WHERE id = :run_id;

-- name: read_run_for_lease
-- Unlocked read that explains why a fenced write matched no row: the run, and whether the caller
-- holds its lease, by the very predicate every fenced write matches ({live_lease}): the fence is
-- judged here, never again in code.
SELECT r.*, ({live_lease}) AS holds_lease, clock_timestamp() AS db_now
FROM agent_runs r WHERE r.id = :run_id;

-- name: lock_run_for_lease
-- read_run_for_lease, locking the row (applying a requested cancel at the holder's write).
SELECT r.*, ({live_lease}) AS holds_lease, clock_timestamp() AS db_now
FROM agent_runs r WHERE r.id = :run_id FOR UPDATE;

-- name: end_run
-- Ends a locked run at once (cancel of an unleased run, cancel applied at the
-- holder's write or at claim, deadline passed at claim, approval rejected), in
-- :status (CANCELLED or FAILED: the transition table's answer for the operation).
-- The lease is cleared with the transition (docs/design.md §invariants, rule 1). A
-- terminal run holds no open intent (rule 8): a tool call still
-- OUTBOUND_INTENT (its holder died or never reported) becomes IN_DOUBT in the
-- same statement, for reconciliation. What the run waited for (a pause reason
-- such as "approve with …", a signal) no longer holds once it has ended.
WITH ended AS (
  UPDATE agent_runs
  SET status = :status, lease_owner = NULL, lease_expires_at = NULL,
      terminal_reason = :reason, finished_at = clock_timestamp(), updated_at = clock_timestamp(),
      pause_reason = NULL, awaiting_signal = NULL,
      cancel_requested_at = CASE WHEN :cancel THEN COALESCE(cancel_requested_at, clock_timestamp())
                                 ELSE cancel_requested_at END,
      cancel_reason = CASE WHEN :cancel THEN COALESCE(cancel_reason, :cancel_reason) ELSE cancel_reason END
  WHERE id = :run_id AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
  RETURNING *
), doubted AS (
  UPDATE tool_executions AS te
  SET status = 'IN_DOUBT', error_code = COALESCE(te.error_code, 'run_ended_with_open_intent')
  FROM ended
  WHERE te.run_id = ended.id AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
)
SELECT ended.*, (SELECT count(*) FROM doubted) AS doubted_intents FROM ended;

-- name: request_cancel
-- A leased run is only flagged; its holder's next write ends it.
UPDATE agent_runs
SET cancel_requested_at = clock_timestamp(), cancel_reason = :reason, updated_at = clock_timestamp()
WHERE id = :run_id AND status IN ('RUNNING', 'WAITING_TOOL') AND cancel_requested_at IS NULL
RETURNING *;

-- name: signal_by_request
-- A signal already queued for the run under this request id (SignalRun's idempotency).
SELECT * FROM run_signals WHERE run_id = :run_id AND request_id = :request_id;

-- name: unconsumable_signals
-- Why a consuming SaveCheckpoint was refused: the seqs that are not this run's pending signals.
SELECT x.seq FROM unnest(:seqs::bigint[]) AS x(seq)
WHERE NOT EXISTS (SELECT 1 FROM run_signals AS s WHERE s.id = x.seq AND s.run_id = :run_id AND s.consumed_at IS NULL)
ORDER BY x.seq;

-- name: insert_signal
-- SignalRun, the run row locked by the caller (lock_run) and not terminal:
-- queues the signal and records its seq on the run; a run parked waiting for
-- this name is due at once (and no longer awaiting). One statement.
WITH signal AS (
  INSERT INTO run_signals (signal_id, run_id, tenant_id, name, payload, request_id, request_hash)
  VALUES (:signal_id, :run_id, :tenant_id, :name, :payload, :request_id, :request_hash)
  RETURNING *
), run AS (
  UPDATE agent_runs AS r
  SET last_signal_seq = signal.id,
      next_attempt_at = CASE WHEN r.awaiting_signal = signal.name AND r.status = 'QUEUED'
                             THEN least(r.next_attempt_at, clock_timestamp()) ELSE r.next_attempt_at END,
      awaiting_signal = CASE WHEN r.awaiting_signal = signal.name THEN NULL ELSE r.awaiting_signal END,
      updated_at = clock_timestamp()
  FROM signal
  WHERE r.id = signal.run_id
  RETURNING r.*
)
SELECT signal.* FROM signal, run;

-- name: resume_run
-- PAUSED_HUMAN -> QUEUED with the operator's response recorded for the next step.
-- Ready at once; enqueued_at is kept, so the run is claimed by its first enqueue.
UPDATE agent_runs
SET status = 'QUEUED', human_input = :human_input, pause_reason = NULL, attempt_count = 0,
    next_attempt_at = clock_timestamp(), claim_ready = true, updated_at = clock_timestamp()
WHERE id = :run_id AND status = 'PAUSED_HUMAN'
RETURNING *;

-- name: freeze_run
-- Commit-unknown recovery found half a write: stop the run, never guess
-- (docs/design.md §commit-unknown).
UPDATE agent_runs
SET status = 'PAUSED_INDOUBT', lease_owner = NULL, lease_expires_at = NULL,
    pause_reason = :reason, updated_at = clock_timestamp()
WHERE id = :run_id AND status IN ('RUNNING', 'WAITING_TOOL')
RETURNING *;

-- name: requeue_resolved
-- A resolved in-doubt run goes back to QUEUED; with a new checkpoint when the
-- resolution carried a result (:version = the new version, else the version is
-- kept), and :journal_added journal entries appended in the same (locked) transaction.
-- Ready at once, in its place by enqueued_at (as resume_run).
UPDATE agent_runs
SET status = 'QUEUED', version = :version, pause_reason = NULL, attempt_count = 0,
    journal_length = journal_length + :journal_added,
    next_attempt_at = clock_timestamp(), claim_ready = true, updated_at = clock_timestamp()
WHERE id = :run_id AND status = 'PAUSED_INDOUBT'
RETURNING *;

-- name: append_journal_entry
-- One journal entry written by an operator path (resolution), in the locked
-- run's transaction: :seq is the run's journal_length + 1, so the journal stays
-- gapless, and the primary key refuses a seq already written.
INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version)
VALUES (:run_id, :seq, :kind, :step_key, :node, :tool, :detail, :fencing_token, :run_version);

-- name: notify_work
-- Wakes long-polling claimers (delivered at commit).
SELECT pg_notify('agentrt_work', :agent_name);

-- name: bump_counter
-- Counts an event an operator must see (e.g. a commit-unknown freeze).
INSERT INTO runtime_counters (name, value) VALUES (:name, 1)
ON CONFLICT (name) DO UPDATE SET value = runtime_counters.value + 1, updated_at = clock_timestamp();

-- name: get_counter
SELECT value FROM runtime_counters WHERE name = :name;

-- name: insert_event
-- One outbox row, written in the same transaction as the change it announces.
-- :write_op/:write_hash bind a caller-chosen event id to its write (operation,
-- request hash: docs/design.md §commit-unknown).
INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                    traceparent, tracestate, write_op, write_hash)
VALUES (:event_id, :run_id, :tenant_id, :event_type, :payload, :fencing_token, :run_version,
        :traceparent, :tracestate, :write_op, :write_hash);

-- name: insert_checkpoint
-- A checkpoint written by an operator path (resolution), in the run's transaction.
INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version, fencing_token, event_id)
VALUES (:run_id, :version, :state, :state_hash, :schema_version, :fencing_token, :event_id);

-- name: latest_checkpoint
SELECT * FROM agent_checkpoints WHERE run_id = :run_id ORDER BY version DESC LIMIT 1;

-- name: tool_execution_for_step
SELECT * FROM tool_executions WHERE run_id = :run_id AND step_key = :step_key;

-- name: lock_tool_execution
SELECT * FROM tool_executions WHERE run_id = :run_id AND step_key = :step_key FOR UPDATE;

-- name: tool_execution_by_key
SELECT * FROM tool_executions WHERE tool_name = :tool_name AND idempotency_key = :idempotency_key;

-- name: resolve_tool_execution
-- Records an operator's or reconciler's evidence on an in-doubt ledger row.
-- The row is never deleted; UNKNOWN keeps it IN_DOUBT with the evidence added.
UPDATE tool_executions
SET status = :status, response_json = COALESCE(:response, response_json),
    remote_resource_id = COALESCE(:remote_resource_id, remote_resource_id),
    reconciliation_evidence = :evidence, resolved_by = :resolved_by, reconciled_at = clock_timestamp(),
    completed_at = CASE WHEN :status IN ('SUCCEEDED', 'FAILED', 'NOT_EXECUTED') THEN clock_timestamp() END
WHERE run_id = :run_id AND step_key = :step_key AND status = 'IN_DOUBT'
RETURNING *;

-- name: close_open_execution
-- Used when a cancelled run's holder reports its tool outcome: the fact is
-- kept in the ledger even though the run ends.
UPDATE tool_executions
SET status = :status, response_json = :response, remote_resource_id = :remote_resource_id,
    error_code = :error_code,
    completed_at = CASE WHEN :status = 'IN_DOUBT' THEN NULL ELSE clock_timestamp() END
WHERE run_id = :run_id AND step_key = :step_key AND status = 'OUTBOUND_INTENT'
RETURNING *;

-- name: run_by_last_event
-- Commit-unknown recovery: the run half of a write that leaves no other row.
SELECT id AS run_id, fencing_token FROM agent_runs WHERE id = :run_id AND last_event_id = :event_id;

-- name: event_by_id
SELECT * FROM outbox WHERE event_id = :event_id;

-- name: checkpoint_by_event
SELECT * FROM agent_checkpoints WHERE event_id = :event_id;

-- name: tool_execution_by_intent_event
SELECT * FROM tool_executions WHERE intent_event_id = :event_id;

-- name: history_checkpoints
-- One page of a run's checkpoints after version :after_version (primary key order).
SELECT *, octet_length(state_json::text) AS page_bytes
FROM agent_checkpoints WHERE run_id = :run_id AND version > :after_version ORDER BY version LIMIT :limit;

-- name: history_tool_executions
-- One page of a run's ledger rows after (:after_at, :after_id) in intent order.
-- The '-infinity' condition (true of every row) selects the partial index
-- tool_executions_run_intent_idx, which no ledger write can use.
SELECT *, octet_length(request_json::text) + coalesce(octet_length(response_json::text), 0)
         + coalesce(octet_length(reconciliation_evidence::text), 0) AS page_bytes
FROM tool_executions
WHERE run_id = :run_id AND outbound_intent_at > '-infinity'::timestamptz
  AND (:after_at::timestamptz IS NULL OR (outbound_intent_at, id) > (:after_at, :after_id::uuid))
ORDER BY outbound_intent_at, id LIMIT :limit;

-- name: history_journal
-- One page of a run's journal entries after seq :after_seq (primary key order).
-- The detail goes out as the text jsonb prints: no decoding and encoding per entry.
SELECT seq, kind, step_key, node, tool, detail::text AS detail_text, run_version, created_at,
       octet_length(detail::text) AS page_bytes
FROM run_journal WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq LIMIT :limit;

-- name: read_journal
-- ReadJournal: entries after seq :after_seq, only while (:worker_id,
-- :fencing_token) holds the run's lease, live by database time. A read: it
-- never writes, and an empty answer is explained by the caller (no entries, or
-- not the holder).
SELECT j.seq, j.kind, j.step_key, j.node, j.tool, j.detail::text AS detail_text, j.run_version,
       j.created_at, octet_length(j.detail::text) AS page_bytes
FROM run_journal AS j
WHERE j.run_id = :run_id AND j.seq > :after_seq
  AND EXISTS (SELECT 1 FROM agent_runs AS r WHERE {live_lease})
ORDER BY j.seq LIMIT :limit;

-- name: read_journal_compact
-- ReadJournal with compact set: the page as one JSON array text, cut after
-- :page_size entries or once the entries' details pass :page_bytes bytes (one
-- entry at least), and how many entries were read past the cut (0: no more).
-- Same lease condition as read_journal.
WITH page AS (
  SELECT j.seq, json_build_array(j.seq, j.kind, j.step_key, j.node, j.tool, j.detail) AS item,
         row_number() OVER (ORDER BY j.seq) AS n,
         sum(octet_length(j.detail::text)) OVER (ORDER BY j.seq) AS running
  FROM run_journal AS j
  WHERE j.run_id = :run_id AND j.seq > :after_seq
    AND EXISTS (SELECT 1 FROM agent_runs AS r WHERE {live_lease})
  ORDER BY j.seq LIMIT :page_size + 1
)
SELECT coalesce((json_agg(item ORDER BY seq)
                 FILTER (WHERE n <= :page_size AND (n = 1 OR running <= :page_bytes)))::text, '[]') AS items,
       count(*) FILTER (WHERE NOT (n <= :page_size AND (n = 1 OR running <= :page_bytes))) AS beyond,
       count(*) AS fetched
FROM page;

-- name: tool_results_for_steps
-- GetToolResults: the holder's ledger rows of steps :step_keys (the (run_id,
-- step_key) unique index), under the same live-lease condition as read_journal.
SELECT te.*, octet_length(te.request_json::text) + coalesce(octet_length(te.response_json::text), 0)
         + coalesce(octet_length(te.reconciliation_evidence::text), 0) AS page_bytes
FROM tool_executions AS te
WHERE te.run_id = :run_id AND te.step_key = ANY(:step_keys::text[])
  AND EXISTS (SELECT 1 FROM agent_runs AS r WHERE {live_lease});

-- name: prune_checkpoints
-- Checkpoint pruning (checkpoint_keep_last = :keep_last > 0), one short
-- statement: up to :batch_runs runs after id :after_id in primary-key order; of
-- each, the checkpoints older than its latest :keep_last versions, at most
-- :max_versions versions per run. A run whose row is locked (a write in
-- flight) is skipped until the next pass. Every version has a checkpoint, so
-- versions above version - :keep_last are never touched; the horizon is
-- recorded on the run row in the same statement, so commit-unknown recovery
-- reads a checkpoint missing at or below it as pruned (docs/design.md
-- §commit-unknown; checkpoints_pruned_through is not indexed: the update stays HOT).
WITH batch AS (
  SELECT id FROM agent_runs WHERE id > :after_id ORDER BY id LIMIT :batch_runs
), due AS (
  SELECT r.id, r.checkpoints_pruned_through AS previous,
         least(r.version - :keep_last, r.checkpoints_pruned_through + :max_versions) AS horizon,
         r.version - :keep_last > r.checkpoints_pruned_through + :max_versions AS behind
  FROM agent_runs AS r JOIN batch ON batch.id = r.id
  WHERE r.version - :keep_last > r.checkpoints_pruned_through
  FOR NO KEY UPDATE OF r SKIP LOCKED
), marked AS (
  UPDATE agent_runs AS r SET checkpoints_pruned_through = due.horizon
  FROM due WHERE r.id = due.id
), deleted AS (
  DELETE FROM agent_checkpoints AS cp USING due
  WHERE cp.run_id = due.id AND cp.version > due.previous AND cp.version <= due.horizon
  RETURNING 1
)
SELECT (SELECT id FROM batch ORDER BY id DESC LIMIT 1) AS last_id, (SELECT count(*) FROM batch) AS runs,
       (SELECT count(*) FROM deleted) AS deleted, (SELECT count(*) FROM due WHERE behind) AS behind;

-- name: history_events
-- One page of a run's outbox events after id :after_id (outbox_run_idx).
SELECT *, octet_length(payload::text) AS page_bytes FROM outbox
WHERE run_id = :run_id AND id > :after_id ORDER BY id LIMIT :limit;

-- name: tenant_stats
-- Operator view (agentrt status): counts and ages by database time, one tenant.
-- Reads only; uses the tenant/status index and the pending-outbox partial index.
SELECT
  (SELECT coalesce(jsonb_object_agg(status, n), '{}'::jsonb)
     FROM (SELECT status, count(*) AS n FROM agent_runs WHERE tenant_id = :tenant_id GROUP BY status) s) AS by_status,
  (SELECT extract(epoch FROM clock_timestamp() - min(next_attempt_at)) FROM agent_runs
    WHERE tenant_id = :tenant_id AND status = 'QUEUED' AND next_attempt_at <= clock_timestamp()) AS oldest_queued_s,
  (SELECT count(*) FROM agent_runs WHERE tenant_id = :tenant_id AND status = 'PAUSED_INDOUBT') AS in_doubt,
  (SELECT extract(epoch FROM clock_timestamp() - min(updated_at)) FROM agent_runs
    WHERE tenant_id = :tenant_id AND status = 'PAUSED_INDOUBT') AS oldest_in_doubt_s,
  (SELECT count(*) FROM outbox WHERE tenant_id = :tenant_id AND published_at IS NULL) AS outbox_pending,
  (SELECT extract(epoch FROM clock_timestamp() - min(created_at)) FROM outbox
    WHERE tenant_id = :tenant_id AND published_at IS NULL) AS outbox_oldest_s,
  clock_timestamp() AS db_now;

-- name: global_stats
-- Metrics (all tenants): runs by status, queue/in-doubt ages, outbox lag, the
-- commit-unknown counter, and the database's size and client connections against
-- max_connections (capacity alerts). Reads only; refreshed on an interval, not per scrape.
SELECT
  (SELECT coalesce(jsonb_object_agg(status, n), '{}'::jsonb)
     FROM (SELECT status, count(*) AS n FROM agent_runs GROUP BY status) s) AS by_status,
  (SELECT extract(epoch FROM clock_timestamp() - min(next_attempt_at)) FROM agent_runs
    WHERE status = 'QUEUED' AND next_attempt_at <= clock_timestamp()) AS oldest_queued_s,
  (SELECT extract(epoch FROM clock_timestamp() - min(updated_at)) FROM agent_runs
    WHERE status = 'PAUSED_INDOUBT') AS oldest_in_doubt_s,
  (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS outbox_pending,
  (SELECT extract(epoch FROM clock_timestamp() - min(created_at)) FROM outbox
    WHERE published_at IS NULL) AS outbox_oldest_s,
  (SELECT coalesce(max(value), 0) FROM runtime_counters WHERE name = 'commit_unknown_inconsistent')
    AS commit_unknown_inconsistent,
  -- QUEUED runs a claim found blocked by a full concurrency limit, by limit (tenant, agent, key).
  (SELECT coalesce(jsonb_object_agg(waiting_on, n), '{}'::jsonb)
     FROM (SELECT waiting_on, count(*) AS n FROM agent_runs
           WHERE status = 'QUEUED' AND waiting_on IS NOT NULL GROUP BY waiting_on) w) AS waiting_on_limit,
  pg_database_size(current_database()) AS database_bytes,
  (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS client_connections,
  current_setting('max_connections')::int AS max_connections;

-- Database health for operators (scheduler/background/db_health.py): read-only, on their own
-- interval, never per scrape.

-- name: db_health_server
-- The database's transaction-id age (wraparound), the WAL position in bytes (NULL
-- on a standby: a counter whose rate is the WAL rate), the database clock, and
-- whether pg_stat_statements is installed in this database.
SELECT
  age(d.datfrozenxid)::bigint AS xid_age,
  CASE WHEN pg_is_in_recovery() THEN NULL
       ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint END AS wal_bytes,
  extract(epoch FROM clock_timestamp())::float8 AS db_clock_s,
  EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements') AS statements_installed
FROM pg_database d
WHERE d.datname = current_database();

-- name: db_health_tables
-- Per table of the schema in use: live and dead tuples (bloat estimate), heap and
-- index sizes, the age of relfrozenxid and the seconds since the last (auto)vacuum
-- (NULL: never vacuumed since the statistics were reset).
SELECT
  t.relname AS table_name,
  t.n_live_tup AS live_tuples,
  t.n_dead_tup AS dead_tuples,
  pg_table_size(t.relid) AS table_bytes,
  pg_indexes_size(t.relid) AS index_bytes,
  age(c.relfrozenxid)::bigint AS xid_age,
  extract(epoch FROM clock_timestamp() - greatest(t.last_autovacuum, t.last_vacuum))::float8 AS vacuum_age_s,
  t.autovacuum_count AS autovacuum_count
FROM pg_stat_user_tables t
JOIN pg_class c ON c.oid = t.relid
WHERE t.schemaname = current_schema()
ORDER BY t.relname;

-- name: db_slow_statements
-- From pg_stat_statements (only where it is installed and loaded): how many of this
-- database's statements take :slow_ms or more on average, and the :top slowest by
-- mean time (normalised text, constants as $n, cut to 120 characters).
WITH mine AS (
  SELECT queryid, query, calls, mean_exec_time
  FROM pg_stat_statements
  WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT
  (SELECT count(*) FROM mine WHERE mean_exec_time >= :slow_ms) AS slow_count,
  coalesce((SELECT jsonb_agg(jsonb_build_object(
              'queryid', s.queryid::text, 'query', left(regexp_replace(s.query, '\s+', ' ', 'g'), 120),
              'calls', s.calls, 'mean_s', s.mean_exec_time / 1000.0) ORDER BY s.mean_exec_time DESC)
            FROM (SELECT * FROM mine ORDER BY mean_exec_time DESC LIMIT :top) s), '[]'::jsonb) AS slowest;

-- The agent registry (docs/design.md §agents): registrations are timed by the database clock, like leases.

-- name: register_agents
-- The whole set one executor serves now, in one statement: its rows for agents
-- it no longer lists go, the listed ones are (re)written with a new expiry, and
-- other executors' rows that lapsed a day ago are cleared away. Parallel
-- arrays, one element per agent; :tools holds each agent's tool names as JSON,
-- :priorities its default priority, :concurrency_keys/:concurrency_maxes its
-- concurrency key template and limit (NULL: none).
WITH listed AS (
  SELECT l.name, l.version, nullif(l.input_schema, '')::jsonb AS input_schema,
         ARRAY(SELECT jsonb_array_elements_text(l.tools::jsonb)) AS tool_names, l.priority, l.key, l.key_max,
         nullif(l.sensitive, '')::jsonb AS sensitive
  FROM unnest(:names::text[], :versions::text[], :schemas::text[], :tools::text[], :priorities::smallint[],
              :concurrency_keys::text[], :concurrency_maxes::int[], :sensitives::text[])
       AS l(name, version, input_schema, tools, priority, key, key_max, sensitive)
), gone AS (
  DELETE FROM agent_registry AS r
  WHERE (r.worker_id = :worker_id
         AND NOT EXISTS (SELECT 1 FROM listed WHERE listed.name = r.agent_name AND listed.version = r.agent_version))
     OR (r.worker_id <> :worker_id AND r.expires_at < clock_timestamp() - interval '1 day')
), written AS (
  INSERT INTO agent_registry (agent_name, agent_version, worker_id, input_schema, tool_names, registered_at,
                              expires_at, default_priority, concurrency_key, concurrency_max, sensitive)
  SELECT name, version, :worker_id, input_schema, tool_names, clock_timestamp(),
         clock_timestamp() + make_interval(secs => :ttl_ms::double precision / 1000), priority, key, key_max,
         sensitive
  FROM listed
  ON CONFLICT (agent_name, agent_version, worker_id) DO UPDATE
  SET input_schema = EXCLUDED.input_schema, tool_names = EXCLUDED.tool_names,
      default_priority = EXCLUDED.default_priority, concurrency_key = EXCLUDED.concurrency_key,
      concurrency_max = EXCLUDED.concurrency_max, sensitive = EXCLUDED.sensitive,
      registered_at = EXCLUDED.registered_at, expires_at = EXCLUDED.expires_at
)
SELECT clock_timestamp() + make_interval(secs => :ttl_ms::double precision / 1000) AS expires_at;

-- name: live_versions
-- The versions of one agent that a live executor serves, each with the input
-- schema, default priority and concurrency key of its latest registration.
SELECT DISTINCT ON (agent_version) agent_version, input_schema, default_priority, concurrency_key, concurrency_max,
       sensitive
FROM agent_registry
WHERE agent_name = :agent_name AND expires_at > clock_timestamp()
ORDER BY agent_version, registered_at DESC;

-- name: list_agents
-- Every live agent version with the executors serving it; its schema and tools
-- are those of the latest registration.
SELECT DISTINCT ON (agent_name, agent_version) agent_name, agent_version, input_schema, tool_names,
       array_agg(worker_id) OVER same AS executors, max(registered_at) OVER same AS last_seen
FROM agent_registry
WHERE expires_at > clock_timestamp()
WINDOW same AS (PARTITION BY agent_name, agent_version)
ORDER BY agent_name, agent_version, registered_at DESC;

-- name: database_epoch
-- The database clock as epoch seconds: the scheduler's clock for credential expiry.
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: insert_api_key
-- A new key; only the hash of its secret is kept (docs/design.md §security).
INSERT INTO api_keys (id, name, tenants, role, secret_hash, created_by, expires_at)
VALUES (:id, :name, :tenants, :role, :secret_hash, :created_by,
        CASE WHEN :expires_in_s::bigint > 0
             THEN clock_timestamp() + make_interval(secs => :expires_in_s::bigint) END)
RETURNING id, name, tenants, role, created_by, created_at, expires_at, revoked_at;

-- name: api_key_for_auth
-- One key for authentication, with its expiry as epoch seconds (judged against the database clock).
SELECT id, name, tenants, role, secret_hash, revoked_at IS NOT NULL AS revoked,
       extract(epoch FROM expires_at)::float8 AS expires_epoch
FROM api_keys WHERE id = :id;

-- name: list_api_keys
-- Keys visible to an admin of :tenants ('*' = every key), newest first, keyset on (created_at, id).
SELECT id, name, tenants, role, created_by, created_at, expires_at, revoked_at
FROM api_keys
WHERE ('*' = ANY(:tenants::text[]) OR tenants <@ :tenants::text[])
  AND (:include_revoked OR revoked_at IS NULL)
  AND (:after_created_at::timestamptz IS NULL OR (created_at, id) < (:after_created_at, :after_id::uuid))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: revoke_api_key
-- Revokes a live key an admin of :tenants may manage; nothing for a revoked or foreign key.
UPDATE api_keys SET revoked_at = clock_timestamp(), revoked_by = :revoked_by
WHERE id = :id AND revoked_at IS NULL
  AND ('*' = ANY(:tenants::text[]) OR tenants <@ :tenants::text[])
RETURNING id, name, tenants, role, created_by, created_at, expires_at, revoked_at;

-- name: api_key_by_id
-- One key an admin of :tenants may manage (revocation reads it first: its state before, for the audit).
SELECT id, name, tenants, role, created_by, created_at, expires_at, revoked_at
FROM api_keys WHERE id = :id AND ('*' = ANY(:tenants::text[]) OR tenants <@ :tenants::text[]);

-- name: insert_audit
-- One audit row, in the transaction of the action it records.
INSERT INTO audit_log (audit_id, principal, principal_kind, tenant_id, action, run_id, step_key, reason, comment,
                       ticket_id, state_before, state_after, evidence, request_id)
VALUES (:audit_id, :principal, :principal_kind, :tenant_id, :action, :run_id, :step_key, :reason, :comment,
        :ticket_id, :state_before, :state_after, :evidence, :request_id)
RETURNING audit_id, at;

-- name: list_audit
-- The audit trail of one tenant (or every tenant when :tenant_id is NULL), newest first, keyset on id.
-- A key of several tenants is audited under "a,b": each of them sees it ('*' keys: every-tenant admins).
SELECT * FROM audit_log
WHERE (:tenant_id::text IS NULL OR tenant_id = :tenant_id OR :tenant_id = ANY(string_to_array(tenant_id, ',')))
  AND (:run_id::uuid IS NULL OR run_id = :run_id)
  AND (:principal::text IS NULL OR principal = :principal)
  AND (:action::text IS NULL OR action = :action)
  AND (:since::timestamptz IS NULL OR at >= :since)
  AND (:until::timestamptz IS NULL OR at < :until)
  AND (:before_id::bigint IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- Retention of terminal runs (migration 0012, scheduler/background/retention.py).

-- name: retention_purge
-- One batch through the narrowly-scoped function that decides what has expired
-- (policies, database clock, terminal status, legal hold, unpublished events).
SELECT * FROM agentrt_retention_purge(:max_runs, :dry_run, :after_finished, :after_id);

-- name: list_retention_policies
-- Every policy; tenant '*' is the default for tenants without one (in the admin scope: the
-- policies are under row-level security, migration 0019).
SELECT tenant_id, keep_days, updated_at FROM retention_policies ORDER BY tenant_id;

-- name: set_retention_policy
-- The owner only, in the admin scope (0019): the runtime roles may read the policies, not shorten them.
INSERT INTO retention_policies (tenant_id, keep_days) VALUES (:tenant_id, :keep_days)
ON CONFLICT (tenant_id) DO UPDATE SET keep_days = EXCLUDED.keep_days, updated_at = clock_timestamp()
RETURNING tenant_id, keep_days, updated_at;

-- name: clear_retention_policy
-- The owner only, in the admin scope; the tenant's runs then follow the default policy (none if '*' is cleared).
DELETE FROM retention_policies WHERE tenant_id = :tenant_id RETURNING tenant_id;
-- Schedules (docs/design.md §schedules): fire times by the database clock, one run per fire time.

-- name: insert_schedule
-- A repeated (tenant, name) inserts nothing: the caller compares spec hashes.
INSERT INTO agent_schedules (id, tenant_id, name, agent_name, agent_version, input, labels, interval_ms, cron,
                             time_zone, overlap, catch_up_window_ms, jitter_ms, next_fire_at, due_at, spec_hash,
                             key_id, wrapped_key)
VALUES (:id, :tenant_id, :name, :agent_name, :agent_version, :input, :labels, :interval_ms, :cron, :time_zone,
        :overlap, :catch_up_window_ms, :jitter_ms, :next_fire_at, :due_at, :spec_hash, :key_id, :wrapped_key)
ON CONFLICT (tenant_id, name) DO NOTHING
RETURNING *;

-- name: schedule_by_name
SELECT * FROM agent_schedules WHERE tenant_id = :tenant_id AND name = :name;

-- name: list_schedules
-- Tenant-scoped, by name (at most 1000: schedules are few).
SELECT * FROM agent_schedules WHERE tenant_id = :tenant_id ORDER BY name LIMIT 1000;

-- name: lock_schedule
-- Tenant-scoped: another tenant's schedule is indistinguishable from none.
SELECT *, clock_timestamp() AS db_now FROM agent_schedules WHERE id = :id AND tenant_id = :tenant_id FOR UPDATE;

-- name: update_schedule
-- The whole spec replaced, under the caller's row lock; the next fire counts from now (:next_fire_at).
UPDATE agent_schedules
SET agent_name = :agent_name, agent_version = :agent_version, input = :input, labels = :labels,
    interval_ms = :interval_ms, cron = :cron, time_zone = :time_zone, overlap = :overlap,
    catch_up_window_ms = :catch_up_window_ms, jitter_ms = :jitter_ms, next_fire_at = :next_fire_at,
    due_at = :due_at, buffered_fire_at = NULL, spec_hash = :spec_hash, key_id = :key_id, wrapped_key = :wrapped_key,
    updated_at = clock_timestamp()
WHERE id = :id
RETURNING *;

-- name: pause_schedule
-- Resuming (:paused false) starts from the :next_fire_at the caller computed from now.
UPDATE agent_schedules
SET paused = :paused, next_fire_at = COALESCE(:next_fire_at::timestamptz, next_fire_at),
    due_at = COALESCE(:due_at::timestamptz, due_at),
    buffered_fire_at = CASE WHEN :paused::boolean THEN buffered_fire_at ELSE NULL END, updated_at = clock_timestamp()
WHERE id = :id
RETURNING *;

-- name: delete_schedule
-- The schedule goes; the runs it submitted stay (their label names it).
DELETE FROM agent_schedules WHERE id = :id RETURNING *;

-- name: lock_due_schedule
-- One schedule the firer must look at now (a fire due, or a buffered fire to
-- re-check), locked; SKIP LOCKED: two replicas never take the same schedule,
-- so one fire time is never fired twice at once (the run's client request id
-- makes it once across restarts too). With the status of its last run.
SELECT s.*, clock_timestamp() AS db_now, r.status AS last_run_status
FROM agent_schedules AS s
LEFT JOIN agent_runs AS r ON r.id = s.last_run_id
WHERE NOT s.paused AND s.due_at <= clock_timestamp()
ORDER BY s.due_at
LIMIT 1
FOR UPDATE OF s SKIP LOCKED;

-- name: record_fire
-- In the firing transaction, with the runs it submitted: the next nominal fire time and when it is due.
UPDATE agent_schedules
SET next_fire_at = :next_fire_at, due_at = :due_at, buffered_fire_at = :buffered_fire_at,
    last_run_id = :last_run_id, last_fire_at = COALESCE(:last_fire_at::timestamptz, last_fire_at), fires = fires + :fired,
    skipped = skipped + :skipped, updated_at = clock_timestamp()
WHERE id = :id;

-- name: lock_spawning_parent
-- SpawnChildren: the holder's RUNNING run, locked (a cancel flagged refuses it,
-- as every fenced write). The children it spawns and its join are written
-- under this lock; a child that ends later counts itself under it too.
SELECT r.* FROM agent_runs AS r
WHERE {fenced_guard}
FOR UPDATE;

-- name: spawn_child
-- One child of a spawn group: id and client_request_id derived from (parent,
-- group, index) by the caller, so a repeated spawn inserts nothing. The
-- parent's tenant and priority; its fair-share pass as submit_run computes it;
-- the spawn's trace context on its submitted event.
WITH inserted AS (
  INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts,
                          budget_max_steps, budget_max_tokens, budget_max_cost_usd, deadline_at,
                          client_request_id, submit_hash, next_attempt_at, priority, fair_pass,
                          parent_run_id, spawn_key, spawn_index, detached, root_run_id, spawn_depth)
  VALUES (:run_id, :tenant_id, :agent_name, :agent_version, :input, :labels, :max_attempts, :max_steps,
          :max_tokens, :max_cost_usd, NULL, :client_request_id, :submit_hash, clock_timestamp(),
          :priority,
          CASE WHEN :fair_step::float8 > 0 THEN greatest(
            coalesce((SELECT q.fair_pass FROM agent_runs AS q
                      WHERE q.tenant_id = :tenant_id AND q.priority = :priority AND q.status = 'QUEUED'
                      ORDER BY q.fair_pass DESC LIMIT 1), 0) + :fair_step,
            (SELECT h.fair_pass FROM agent_runs AS h
             WHERE h.status = 'QUEUED' AND h.claim_ready AND h.priority = :priority
             ORDER BY h.priority DESC, h.fair_pass, h.enqueued_at, h.id LIMIT 1)) ELSE 0 END,
          :parent_run_id, :spawn_key, :spawn_index, :detached, :root_run_id, :spawn_depth)
  ON CONFLICT (tenant_id, client_request_id) WHERE client_request_id IS NOT NULL DO NOTHING
  RETURNING *
), sealed AS (
  -- The child's wrapped data key, when its agent marks sensitive fields (as submit_run).
  INSERT INTO run_data_keys (run_id, tenant_id, key_id, wrapped_key, sensitive)
  SELECT id, tenant_id, :key_id, :wrapped_key, :sensitive FROM inserted WHERE :key_id::text IS NOT NULL
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, traceparent, tracestate)
  SELECT :event_id, id, tenant_id, 'agent.run_submitted',
         jsonb_build_object('agent_name', agent_name, 'agent_version', agent_version,
                            'client_request_id', client_request_id, 'parent_run_id', parent_run_id,
                            'spawn_key', spawn_key, 'spawn_index', spawn_index),
         :traceparent, :tracestate
  FROM inserted
)
SELECT count(*) AS created FROM inserted;

-- name: record_join
-- The join the parent (locked by lock_spawning_parent, in an earlier statement
-- of the transaction: this one's snapshot sees every child that ended before
-- the lock was granted; one ending later waits for the lock and counts itself)
-- waits on: its group, mode, size and how many of its children have ended.
UPDATE agent_runs AS r
SET join_key = :spawn_key, join_mode = :join_mode, join_total = :join_total,
    join_done = (SELECT count(*) FROM agent_runs AS c
                 WHERE c.parent_run_id = r.id AND c.spawn_key = :spawn_key
                   AND c.status IN ('COMPLETED', 'FAILED', 'CANCELLED')),
    updated_at = clock_timestamp()
WHERE r.id = :run_id
RETURNING r.join_done;

-- name: spawn_group
-- A parent's children of one group, by index (the join's answer), each with
-- the cost its latest checkpoint records (a shared budget charges it to the parent).
SELECT c.id, c.agent_name, c.status, c.result, c.terminal_reason, c.spawn_index, c.finished_at,
       coalesce((SELECT (cp.state_json -> 'usage' ->> 'cost_usd')::float8 FROM agent_checkpoints AS cp
                 WHERE cp.run_id = c.id AND cp.version = c.version), 0) AS cost_usd
FROM agent_runs AS c
WHERE c.parent_run_id = :parent_run_id AND c.spawn_key = :spawn_key
ORDER BY c.spawn_index;

-- name: run_tree
-- A run and its descendants (GetRunTree), within the tenant, breadth first (by
-- depth, then parent, spawn group and index), at most :limit rows after the
-- page cursor (:after_depth NULL: from the run itself; 0: after the run). No
-- depth limit: the walk is bounded by the tree, which SpawnChildren bounds
-- (max_spawn_depth, max_descendants_per_root) and which is acyclic (a child is
-- inserted after its parent, whose id it keeps). Each step one probe of
-- agent_runs_parent_idx per run.
WITH RECURSIVE tree AS (
  SELECT r.id, 0 AS depth FROM agent_runs AS r WHERE r.id = :run_id AND r.tenant_id = :tenant_id
  UNION ALL
  SELECT c.id, tree.depth + 1 FROM tree JOIN agent_runs AS c ON c.parent_run_id = tree.id
)
SELECT r.*, tree.depth FROM tree JOIN agent_runs AS r ON r.id = tree.id
WHERE r.tenant_id = :tenant_id
  AND (:after_depth::integer IS NULL OR tree.depth > :after_depth::integer
       OR (tree.depth = :after_depth::integer
           AND (r.parent_run_id, r.spawn_key, r.spawn_index, r.id)
               > (:after_parent::uuid, :after_spawn_key::text, :after_spawn_index::integer, :after_id::uuid)))
ORDER BY tree.depth, r.parent_run_id, r.spawn_key, r.spawn_index, r.id
LIMIT :limit;

-- name: cancellable_descendants
-- What cancelling a run cancels with it: its descendants that have not ended,
-- through children that were not detached (a detached child and its own
-- descendants are left alone), deepest first: a cancel locks them in this order
-- and its run last, as a child ending locks itself and then its parent. No
-- depth limit (as run_tree: the tree is bounded and acyclic).
WITH RECURSIVE tree AS (
  SELECT c.id, 1 AS depth FROM agent_runs AS c WHERE c.parent_run_id = :run_id AND NOT c.detached
  UNION ALL
  SELECT c.id, tree.depth + 1 FROM tree JOIN agent_runs AS c ON c.parent_run_id = tree.id
  WHERE NOT c.detached
)
SELECT r.id, tree.depth FROM tree JOIN agent_runs AS r ON r.id = tree.id
WHERE r.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
ORDER BY tree.depth DESC, r.id;

-- name: lock_spawn_tree
-- SpawnChildren: serialises the spawns of one tree (any of its runs) so that
-- their count of the root's descendants and their inserts do not interleave;
-- released at commit.
SELECT pg_advisory_xact_lock(hashtextextended('agentrt.spawn_tree:' || :root_run_id::uuid::text, 0));

-- name: tree_descendants
-- How many runs a tree's root has below it, at any depth, ended or not, by
-- agent_runs_root_idx (the root's own row may be gone: retention).
SELECT count(*) FROM agent_runs WHERE root_run_id = :root_run_id;

-- name: run_data_key
-- A run's wrapped data key and what its agent marked (no row: the run holds no sealed values).
SELECT k.key_id, k.wrapped_key, k.sensitive, r.input
FROM run_data_keys k JOIN agent_runs r ON r.id = k.run_id
WHERE k.run_id = :run_id;

-- name: run_sealed_values
-- A run's stored payloads that hold sealed values (ledger requests and answers, signal payloads, the
-- human input of ResumeRun), each with the field it came from: a scheduler that did not see them
-- sealed learns the run's marked values from them (scheduler/store/keys.py).
SELECT 'request_json' AS field, request_json AS value FROM tool_executions
WHERE run_id = :run_id AND request_json::text LIKE '%"$sealed"%'
UNION ALL
SELECT 'response_json', response_json FROM tool_executions
WHERE run_id = :run_id AND response_json::text LIKE '%"$sealed"%'
UNION ALL
SELECT 'payload_json', payload FROM run_signals
WHERE run_id = :run_id AND payload::text LIKE '%"$sealed"%'
UNION ALL
SELECT 'input_json', human_input FROM agent_runs
WHERE id = :run_id AND human_input::text LIKE '%"$sealed"%';

-- name: data_keys_to_rotate
-- The next batch of data keys wrapped by another KEK than the current one, in run order after
-- :after, locked so a concurrent rotation skips them (a submit or a read never waits: reads take
-- no lock, and new keys are wrapped by the current KEK already).
SELECT run_id, key_id, wrapped_key FROM run_data_keys
WHERE key_id <> :current_key_id AND run_id > :after
ORDER BY run_id
LIMIT :batch
FOR UPDATE SKIP LOCKED;

-- name: rewrap_data_keys
-- One batch re-wrapped under the current KEK (parallel arrays), each only while still wrapped by
-- the KEK it was read under.
UPDATE run_data_keys AS k
SET key_id = :current_key_id, wrapped_key = n.wrapped_key, rotated_at = clock_timestamp()
FROM unnest(:run_ids::uuid[], :old_key_ids::text[], :wrapped_keys::bytea[]) AS n(run_id, old_key_id, wrapped_key)
WHERE k.run_id = n.run_id AND k.key_id = n.old_key_id;

-- name: schedule_keys_to_rotate
-- As data_keys_to_rotate, for the data keys of schedules with sealed input (migration 0018).
SELECT id, key_id, wrapped_key FROM agent_schedules
WHERE key_id IS NOT NULL AND key_id <> :current_key_id AND id > :after
ORDER BY id
LIMIT :batch
FOR UPDATE SKIP LOCKED;

-- name: rewrap_schedule_keys
-- As rewrap_data_keys: one batch of schedule keys, each only while still wrapped by the KEK it was read under.
UPDATE agent_schedules AS s
SET key_id = :current_key_id, wrapped_key = n.wrapped_key, key_rotated_at = clock_timestamp()
FROM unnest(:ids::uuid[], :old_key_ids::text[], :wrapped_keys::bytea[]) AS n(id, old_key_id, wrapped_key)
WHERE s.id = n.id AND s.key_id = n.old_key_id;

-- name: data_key_counts
-- Data keys per KEK id, of runs and of schedules (agentrt encryption status).
SELECT key_id, count(*) AS keys
FROM (SELECT key_id FROM run_data_keys
      UNION ALL SELECT key_id FROM agent_schedules WHERE key_id IS NOT NULL) AS k
GROUP BY key_id ORDER BY key_id;

-- Runtime flow limits (migration 0015, scheduler/flow_limits.py).

-- name: list_flow_limits
-- Every runtime limit (a handful of rows), read by each replica every limits_refresh_ms, from any
-- transaction (a submit's is in its tenant's setting): through the function that reads them in
-- the work scope (migration 0019), as flow_limits' policies show a tenant its own rows only.
SELECT scope, tenant_id, subject, limit_name, value, updated_at, updated_by FROM agentrt_flow_limits();

-- name: lock_flow_limit
-- The limit's row as it was, under lock (its state before, for the audit).
SELECT scope, tenant_id, subject, limit_name, value, updated_at, updated_by FROM flow_limits
WHERE scope = :scope AND tenant_id = :tenant_id AND subject = :subject AND limit_name = :limit_name
FOR UPDATE;

-- name: set_flow_limit
-- SetLimit: the row, new or changed (who set it and when, by database time).
INSERT INTO flow_limits (scope, tenant_id, subject, limit_name, value, updated_by)
VALUES (:scope, :tenant_id, :subject, :limit_name, :value, :updated_by)
ON CONFLICT (scope, tenant_id, subject, limit_name)
DO UPDATE SET value = EXCLUDED.value, updated_by = EXCLUDED.updated_by, updated_at = clock_timestamp()
RETURNING scope, tenant_id, subject, limit_name, value, updated_at, updated_by;

-- name: clear_flow_limit
-- ClearLimit: the row as it was (nothing when there was none); the config's value applies again.
DELETE FROM flow_limits
WHERE scope = :scope AND tenant_id = :tenant_id AND subject = :subject AND limit_name = :limit_name
RETURNING scope, tenant_id, subject, limit_name, value, updated_at, updated_by;

-- name: tenant_flow
-- agentrt status, one tenant: queued runs, runs holding a live lease (the slots concurrency limits
-- count), and queued runs a claim found blocked, by the limit they wait on (tenant, agent, key).
SELECT
  (SELECT count(*) FROM agent_runs WHERE tenant_id = :tenant_id AND status = 'QUEUED') AS queued,
  (SELECT count(*) FROM agent_runs WHERE tenant_id = :tenant_id AND lease_owner IS NOT NULL
     AND lease_expires_at > clock_timestamp()) AS running,
  (SELECT coalesce(jsonb_object_agg(waiting_on, n), '{}'::jsonb)
     FROM (SELECT waiting_on, count(*) AS n FROM agent_runs
           WHERE tenant_id = :tenant_id AND status = 'QUEUED' AND waiting_on IS NOT NULL GROUP BY waiting_on) w)
    AS waiting_on;
