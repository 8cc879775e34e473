-- agentrt scheduler: every runtime query, as named blocks.
-- Format: `-- name: <name>` then comment lines saying which invariant the
-- query guards, then the statement. Parsed once at import by scheduler/queries.py.
-- Lease predicates always use clock_timestamp(): the database clock decides.

-- name: server_now
-- The database clock, for callers that must report time (never the worker's clock).
SELECT clock_timestamp() AS now;

-- name: submit_run
-- One statement: the run and its submitted event commit together. A repeated
-- (tenant, client_request_id) inserts nothing. Claimers are woken afterwards by
-- a coalesced NOTIFY (scheduler/notifier.py): a NOTIFY inside every submit's
-- transaction would serialise their commits on the notification queue lock.
WITH inserted AS (
  INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts,
                          budget_max_steps, budget_max_tokens, budget_max_cost_usd, deadline_at,
                          client_request_id, submit_hash, next_attempt_at)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, clock_timestamp())
  ON CONFLICT (tenant_id, client_request_id) WHERE client_request_id IS NOT NULL DO NOTHING
  RETURNING *
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, traceparent, tracestate)
  SELECT $14, id, tenant_id, 'agent.run_submitted',
         jsonb_build_object('agent_name', agent_name, 'agent_version', agent_version,
                            'client_request_id', client_request_id),
         $15, $16
  FROM inserted
)
SELECT inserted.* FROM inserted;

-- name: get_run_by_client_request
SELECT * FROM agent_runs WHERE tenant_id = $1 AND client_request_id = $2;

-- name: get_run
-- Tenant-scoped read: another tenant's run is indistinguishable from none.
SELECT * FROM agent_runs WHERE id = $1 AND tenant_id = $2;

-- name: list_runs
-- Keyset pagination on (created_at, id), newest first, within one tenant.
SELECT * FROM agent_runs
WHERE tenant_id = $1
  AND ($2::text[] IS NULL OR status = ANY($2::text[]))
  AND ($3::text IS NULL OR agent_name = $3)
  AND ($4::timestamptz IS NULL OR (created_at, id) < ($4, $5::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $6;

-- name: claim_work
-- Takes one run for worker $1: first a RUNNING/WAITING_TOOL run whose lease
-- lapsed by database time, else a QUEUED run that is due. FOR UPDATE SKIP LOCKED:
-- two claimers never take the same row. The fencing token grows on every
-- claim; attempt_count only when claimed from QUEUED. A WAITING_TOOL run stays
-- WAITING_TOOL (its new holder may look up or freeze, never resend).
-- UNION ALL without ORDER BY yields `expired` first; LIMIT 1 stops before
-- `queued` is scanned when an expired run was found.
WITH expired AS (
  SELECT id FROM agent_runs
  WHERE status IN ('RUNNING', 'WAITING_TOOL') AND lease_expires_at < clock_timestamp()
    AND agent_name = ANY($3::text[])
  ORDER BY lease_expires_at, created_at, id
  LIMIT 1
  FOR UPDATE SKIP LOCKED
), queued AS (
  SELECT id FROM agent_runs
  WHERE status = 'QUEUED' AND next_attempt_at <= clock_timestamp()
    AND agent_name = ANY($3::text[])
  ORDER BY next_attempt_at, created_at, id
  LIMIT 1
  FOR UPDATE SKIP LOCKED
), candidate AS (
  (SELECT id FROM expired UNION ALL SELECT id FROM queued) LIMIT 1
), claimed AS (
  UPDATE agent_runs AS r
  SET status = CASE WHEN r.status = 'QUEUED' THEN 'RUNNING' ELSE r.status END,
      lease_owner = $1,
      lease_expires_at = clock_timestamp() + make_interval(secs => $2::double precision / 1000),
      fencing_token = r.fencing_token + 1,
      attempt_count = CASE WHEN r.status = 'QUEUED' THEN r.attempt_count + 1 ELSE r.attempt_count END,
      updated_at = clock_timestamp()
  FROM candidate AS c
  WHERE r.id = c.id
  RETURNING r.*
)
SELECT claimed.*, clock_timestamp() AS db_now,
       cp.version AS cp_version, cp.state_json AS cp_state_json, cp.state_hash AS cp_state_hash,
       cp.schema_version AS cp_schema_version, cp.fencing_token AS cp_fencing_token,
       cp.event_id AS cp_event_id, cp.created_at AS cp_created_at,
       te.id AS te_id, te.step_key AS te_step_key, te.tool_name AS te_tool_name,
       te.idempotency_key AS te_idempotency_key, te.request_json AS te_request_json,
       te.request_hash AS te_request_hash, te.status AS te_status,
       te.remote_resource_id AS te_remote_resource_id, te.response_json AS te_response_json,
       te.error_code AS te_error_code, te.fencing_token AS te_fencing_token,
       te.outbound_intent_at AS te_outbound_intent_at, te.completed_at AS te_completed_at,
       te.reconciled_at AS te_reconciled_at, te.reconciliation_evidence AS te_reconciliation_evidence
FROM claimed
LEFT JOIN agent_checkpoints AS cp ON cp.run_id = claimed.id AND cp.version = claimed.version
LEFT JOIN tool_executions AS te ON te.run_id = claimed.id AND te.step_key = claimed.current_step_key;

-- name: heartbeat
-- Extends a lease only while it is still live by database time: a worker whose
-- lease lapsed cannot revive itself, even if nobody has claimed the run yet.
UPDATE agent_runs
SET lease_expires_at = clock_timestamp() + make_interval(secs => $4::double precision / 1000),
    updated_at = clock_timestamp()
WHERE id = $1 AND lease_owner = $2 AND fencing_token = $3
  AND lease_expires_at > clock_timestamp()
  AND status IN ('RUNNING', 'WAITING_TOOL')
  AND cancel_requested_at IS NULL
RETURNING lease_expires_at, tenant_id;

-- name: save_checkpoint
-- CAS on (run, owner, fence, version) under a live lease; the version bump,
-- the checkpoint row, the journal entries it records ($17..$22, parallel
-- arrays, possibly empty) and its outbox event commit in this one statement.
-- The entries must continue the run's journal (first seq = journal_length + 1,
-- consecutive: checked by the service), else nothing matches and nothing is written.
WITH run AS (
  UPDATE agent_runs
  SET version = version + 1,
      checkpoint_schema_version = $6,
      current_step_key = COALESCE($8, current_step_key),
      journal_length = journal_length + cardinality($17::bigint[]),
      updated_at = clock_timestamp()
  WHERE id = $1 AND lease_owner = $2 AND fencing_token = $3 AND version = $4
    AND status = ANY($5::text[])
    AND lease_expires_at > clock_timestamp()
    AND cancel_requested_at IS NULL
    AND (cardinality($17::bigint[]) = 0 OR ($17::bigint[])[1] = journal_length + 1)
  RETURNING id, tenant_id, version, fencing_token
), journal AS (
  INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version)
  SELECT run.id, e.seq, e.kind, e.step_key, e.node, e.tool, e.detail::jsonb, run.fencing_token, run.version
  FROM run, unnest($17::bigint[], $18::text[], $19::text[], $20::text[], $21::text[],
                   $22::text[]) AS e(seq, kind, step_key, node, tool, detail)
), checkpoint AS (
  INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version,
                                 fencing_token, event_id)
  SELECT id, version, $7, $9, $6, fencing_token, $10 FROM run
  RETURNING version
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT $10, id, tenant_id, $11,
         $12::jsonb || jsonb_build_object('version', version, 'step_key', $8::text),
         fencing_token, version, $13, $14, $15, $16::bytea
  FROM run
)
SELECT checkpoint.version, (SELECT tenant_id FROM run) AS tenant_id FROM checkpoint;

-- name: begin_tool_call
-- Tx1: records the outbound intent before any network I/O. Refused (no row)
-- unless the current checkpoint already holds this very decision (same step
-- key, tool and request hash: invariant 6) and no ledger row exists for the
-- step. The run moves to WAITING_TOOL in the same statement.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = 'WAITING_TOOL', current_step_key = $6, updated_at = clock_timestamp()
  WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3 AND r.version = $4
    AND r.status = ANY($5::text[])
    AND r.lease_expires_at > clock_timestamp()
    AND r.cancel_requested_at IS NULL
    AND EXISTS (
      SELECT 1 FROM agent_checkpoints AS cp
      WHERE cp.run_id = r.id AND cp.version = r.version
        AND cp.state_json -> 'pending_tool' ->> 'step_key' = $6
        AND cp.state_json -> 'pending_tool' ->> 'tool_name' = $7
        AND cp.state_json -> 'pending_tool' ->> 'request_hash' = encode($10, 'hex'))
    AND NOT EXISTS (SELECT 1 FROM tool_executions AS te WHERE te.run_id = r.id AND te.step_key = $6)
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token
), execution AS (
  INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json,
                               request_hash, status, fencing_token, intent_event_id)
  SELECT $11, id, $6, $7, $8, $9, $10, 'OUTBOUND_INTENT', fencing_token, $12 FROM run
  RETURNING *
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT $12, id, tenant_id, 'agent.tool_requested',
         jsonb_build_object('step_key', $6::text, 'tool_name', $7::text, 'idempotency_key', $8::text,
                            'execution_id', $11::uuid),
         fencing_token, version, $13, $14, $15, $16::bytea
  FROM run
)
SELECT execution.*, (SELECT tenant_id FROM run) AS tenant_id FROM execution;

-- name: complete_tool_call
-- Tx2: the tool's definite result, the next checkpoint, the version bump, the
-- return to RUNNING and the event commit together, or nothing does. The run
-- must be WAITING_TOOL on this step under a live lease with this fence, and
-- the ledger row must still be OUTBOUND_INTENT (asserted: exactly one row).
-- The journal entries the checkpoint records ($21..$26) are appended as in
-- save_checkpoint.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = 'RUNNING', version = r.version + 1, current_step_key = $8,
      checkpoint_schema_version = $10, journal_length = r.journal_length + cardinality($21::bigint[]),
      -- A succeeded step is progress: from here the claim in hand is the next step's first
      -- attempt, so a long run's retries over thousands of steps never add up to max_attempts.
      attempt_count = CASE WHEN $7 = 'SUCCEEDED' THEN 1 ELSE r.attempt_count END,
      updated_at = clock_timestamp()
  WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3 AND r.version = $4
    AND r.status = ANY($6::text[]) AND r.current_step_key = $5
    AND r.lease_expires_at > clock_timestamp()
    AND r.cancel_requested_at IS NULL
    AND EXISTS (SELECT 1 FROM tool_executions AS te
                WHERE te.run_id = r.id AND te.step_key = $5 AND te.status = 'OUTBOUND_INTENT')
    AND (cardinality($21::bigint[]) = 0 OR ($21::bigint[])[1] = r.journal_length + 1)
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token
), journal AS (
  INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version)
  SELECT run.id, e.seq, e.kind, e.step_key, e.node, e.tool, e.detail::jsonb, run.fencing_token, run.version
  FROM run, unnest($21::bigint[], $22::text[], $23::text[], $24::text[], $25::text[],
                   $26::text[]) AS e(seq, kind, step_key, node, tool, detail)
), execution AS (
  UPDATE tool_executions AS te
  SET status = $7, response_json = $11, remote_resource_id = $12, error_code = $13,
      completed_at = clock_timestamp(),
      reconciliation_evidence = COALESCE($14::jsonb, te.reconciliation_evidence),
      reconciled_at = CASE WHEN $14::jsonb IS NULL THEN te.reconciled_at ELSE clock_timestamp() END
  FROM run
  WHERE te.run_id = $1 AND te.run_id = run.id AND te.step_key = $5 AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
), checkpoint AS (
  INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version,
                                 fencing_token, event_id)
  SELECT id, version, $9, $15, $10, fencing_token, $16 FROM run
  RETURNING version
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT $16, id, tenant_id, CASE WHEN $7 = 'SUCCEEDED' THEN 'agent.tool_succeeded' ELSE 'agent.tool_failed' END,
         jsonb_build_object('step_key', $5::text, 'version', version, 'error_code', $13::text),
         fencing_token, version, $17, $18, $19, $20::bytea
  FROM run
)
SELECT checkpoint.version, (SELECT tenant_id FROM run) AS tenant_id,
       agentrt_assert((SELECT count(*) FROM execution) = 1, 'tool ledger row was not open') AS ok
FROM checkpoint;

-- name: complete_tool_call_and_end
-- Tx2 whose checkpoint records the run's end (the next decision is to finish
-- or fail): the definite result, the checkpoint, the end of the run
-- ($19 = COMPLETED | FAILED, with result, reason and finished_at, the lease
-- cleared) and both events commit together. Guards as complete_tool_call;
-- the journal entries are $26..$31.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = $19, version = r.version + 1, current_step_key = $8,
      checkpoint_schema_version = $10, lease_owner = NULL, lease_expires_at = NULL,
      journal_length = r.journal_length + cardinality($26::bigint[]),
      result = CASE WHEN $19 = 'COMPLETED' THEN $20::jsonb ELSE r.result END,
      terminal_reason = $21, finished_at = clock_timestamp(), last_event_id = $23,
      updated_at = clock_timestamp()
  WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3 AND r.version = $4
    AND r.status = ANY($6::text[]) AND r.current_step_key = $5
    AND r.lease_expires_at > clock_timestamp()
    AND r.cancel_requested_at IS NULL
    AND EXISTS (SELECT 1 FROM tool_executions AS te
                WHERE te.run_id = r.id AND te.step_key = $5 AND te.status = 'OUTBOUND_INTENT')
    AND (cardinality($26::bigint[]) = 0 OR ($26::bigint[])[1] = r.journal_length + 1)
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token, r.status, r.attempt_count
), journal AS (
  INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version)
  SELECT run.id, e.seq, e.kind, e.step_key, e.node, e.tool, e.detail::jsonb, run.fencing_token, run.version
  FROM run, unnest($26::bigint[], $27::text[], $28::text[], $29::text[], $30::text[],
                   $31::text[]) AS e(seq, kind, step_key, node, tool, detail)
), execution AS (
  UPDATE tool_executions AS te
  SET status = $7, response_json = $11, remote_resource_id = $12, error_code = $13,
      completed_at = clock_timestamp(),
      reconciliation_evidence = COALESCE($14::jsonb, te.reconciliation_evidence),
      reconciled_at = CASE WHEN $14::jsonb IS NULL THEN te.reconciled_at ELSE clock_timestamp() END
  FROM run
  WHERE te.run_id = $1 AND te.run_id = run.id AND te.step_key = $5 AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
), checkpoint AS (
  INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version,
                                 fencing_token, event_id)
  SELECT id, version, $9, $15, $10, fencing_token, $16 FROM run
  RETURNING version
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT $16, id, tenant_id, CASE WHEN $7 = 'SUCCEEDED' THEN 'agent.tool_succeeded' ELSE 'agent.tool_failed' END,
         jsonb_build_object('step_key', $5::text, 'version', version, 'error_code', $13::text),
         fencing_token, version, $17, $18, $24, $25::bytea
  FROM run
  UNION ALL
  SELECT $23, id, tenant_id, CASE status WHEN 'COMPLETED' THEN 'agent.run_completed' ELSE 'agent.run_failed' END,
         jsonb_build_object('status', status, 'reason', $21::text, 'error_class', $22::text,
                            'next_attempt_at', NULL, 'attempt_count', attempt_count),
         fencing_token, version, $17, $18, $24, $25::bytea
  FROM run
)
SELECT checkpoint.version, (SELECT tenant_id FROM run) AS tenant_id, (SELECT status FROM run) AS status,
       agentrt_assert((SELECT count(*) FROM execution) = 1, 'tool ledger row was not open') AS ok
FROM checkpoint;

-- name: complete_and_begin_tool_call
-- Tx2 of step $5 and Tx1 of step $15 in one statement: all of it commits or
-- none of it does. Guards, together, what complete_tool_call and
-- begin_tool_call guard apart:
--   * fence, owner, version CAS and a live lease by clock_timestamp()
--     (invariant 2); a flagged cancel matches no row;
--   * the run is WAITING_TOOL on step $5 whose ledger row is still
--     OUTBOUND_INTENT (asserted: exactly one row closes);
--   * the definite result, the new checkpoint (version + 1) and its event commit
--     together (invariant 5);
--   * the new checkpoint's pending_tool records the next call: same step key,
--     tool and request hash ($18, computed by the server) (invariant 6: the
--     decision is persisted in the very transaction that records its intent,
--     before any network I/O);
--   * no ledger row exists yet for step $15 (a row is never a licence to
--     resend); its OUTBOUND_INTENT row and agent.tool_requested event commit
--     with the rest (invariant 3), and the run stays WAITING_TOOL on $15;
--   * the journal entries the checkpoint records ($27..$32) continue the
--     run's journal and are appended with it, as in save_checkpoint.
WITH run AS (
  UPDATE agent_runs AS r
  SET version = r.version + 1, current_step_key = $15, checkpoint_schema_version = $9,
      journal_length = r.journal_length + cardinality($27::bigint[]),
      attempt_count = CASE WHEN $7 = 'SUCCEEDED' THEN 1 ELSE r.attempt_count END,  -- progress (as above)
      updated_at = clock_timestamp()
  WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3 AND r.version = $4
    AND r.status = ANY($6::text[]) AND r.current_step_key = $5
    AND r.lease_expires_at > clock_timestamp()
    AND r.cancel_requested_at IS NULL
    AND EXISTS (SELECT 1 FROM tool_executions AS te
                WHERE te.run_id = r.id AND te.step_key = $5 AND te.status = 'OUTBOUND_INTENT')
    AND NOT EXISTS (SELECT 1 FROM tool_executions AS te WHERE te.run_id = r.id AND te.step_key = $15)
    AND $8::jsonb -> 'pending_tool' ->> 'step_key' = $15
    AND $8::jsonb -> 'pending_tool' ->> 'tool_name' = $16
    AND $8::jsonb -> 'pending_tool' ->> 'request_hash' = encode($18, 'hex')
    AND (cardinality($27::bigint[]) = 0 OR ($27::bigint[])[1] = r.journal_length + 1)
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token
), journal AS (
  INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version)
  SELECT run.id, e.seq, e.kind, e.step_key, e.node, e.tool, e.detail::jsonb, run.fencing_token, run.version
  FROM run, unnest($27::bigint[], $28::text[], $29::text[], $30::text[], $31::text[],
                   $32::text[]) AS e(seq, kind, step_key, node, tool, detail)
), execution AS (
  UPDATE tool_executions AS te
  SET status = $7, response_json = $10, remote_resource_id = $11, error_code = $12,
      completed_at = clock_timestamp(),
      reconciliation_evidence = COALESCE($13::jsonb, te.reconciliation_evidence),
      reconciled_at = CASE WHEN $13::jsonb IS NULL THEN te.reconciled_at ELSE clock_timestamp() END
  FROM run
  WHERE te.run_id = $1 AND te.run_id = run.id AND te.step_key = $5 AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
), checkpoint AS (
  INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version,
                                 fencing_token, event_id)
  SELECT id, version, $8, $14, $9, fencing_token, $21 FROM run
  RETURNING version
), intent AS (
  INSERT INTO tool_executions (id, run_id, step_key, tool_name, idempotency_key, request_json,
                               request_hash, status, fencing_token, intent_event_id)
  SELECT $19, id, $15, $16, $17, $20, $18, 'OUTBOUND_INTENT', fencing_token, $22 FROM run
  RETURNING *
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT $21, id, tenant_id, CASE WHEN $7 = 'SUCCEEDED' THEN 'agent.tool_succeeded' ELSE 'agent.tool_failed' END,
         jsonb_build_object('step_key', $5::text, 'version', version, 'error_code', $12::text),
         fencing_token, version, $23, $24, $25, $26::bytea
  FROM run
  UNION ALL
  SELECT $22, id, tenant_id, 'agent.tool_requested',
         jsonb_build_object('step_key', $15::text, 'tool_name', $16::text, 'idempotency_key', $17::text,
                            'execution_id', $19::uuid),
         fencing_token, version, $23, $24, $25, $26::bytea
  FROM run
)
SELECT intent.*, checkpoint.version AS cp_version, (SELECT tenant_id FROM run) AS tenant_id,
       agentrt_assert((SELECT count(*) FROM execution) = 1, 'tool ledger row was not open') AS ok
FROM intent, checkpoint;

-- name: tool_not_executed
-- Takeover: the downstream's lookup proved the request never took effect.
-- The ledger row is closed NOT_EXECUTED with its evidence (never deleted) and
-- the run returns to QUEUED with backoff; its next attempt gets a new step key.
-- At max_attempts the run ends FAILED instead: a retry loop must end somewhere.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = CASE WHEN r.attempt_count >= r.max_attempts THEN 'FAILED' ELSE 'QUEUED' END,
      lease_owner = NULL, lease_expires_at = NULL,
      next_attempt_at = clock_timestamp()
        + make_interval(secs => agentrt_backoff_ms(r.id, r.attempt_count, $7, $8, $9) / 1000),
      terminal_reason = CASE WHEN r.attempt_count >= r.max_attempts
        THEN 'attempts exhausted (' || r.attempt_count || '/' || r.max_attempts || '): tool not executed'
        ELSE r.terminal_reason END,
      finished_at = CASE WHEN r.attempt_count >= r.max_attempts THEN clock_timestamp() END,
      last_event_id = $12, updated_at = clock_timestamp()
  WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3 AND r.version = $4
    AND r.status = ANY($6::text[]) AND r.current_step_key = $5
    AND r.lease_expires_at > clock_timestamp()
    AND r.cancel_requested_at IS NULL
    AND EXISTS (SELECT 1 FROM tool_executions AS te
                WHERE te.run_id = r.id AND te.step_key = $5 AND te.status = 'OUTBOUND_INTENT')
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token, r.agent_name, r.status
), execution AS (
  UPDATE tool_executions AS te
  SET status = 'NOT_EXECUTED', error_code = $10, completed_at = clock_timestamp(),
      reconciled_at = clock_timestamp(), reconciliation_evidence = $11, resolved_by = $2
  FROM run
  WHERE te.run_id = $1 AND te.run_id = run.id AND te.step_key = $5 AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT $12, id, tenant_id, 'agent.tool_not_executed',
         jsonb_build_object('step_key', $5::text, 'evidence', $11::jsonb, 'status', status),
         fencing_token, version, $13, $14, $15, $16::bytea
  FROM run
)
SELECT run.version, run.status, run.tenant_id,
       agentrt_assert((SELECT count(*) FROM execution) = 1, 'tool ledger row was not open') AS ok
FROM run;

-- name: mark_tool_in_doubt
-- Unknown outcome: freeze. The ledger row becomes IN_DOUBT, the run
-- PAUSED_INDOUBT with its lease cleared, and an event is written, together.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = 'PAUSED_INDOUBT', lease_owner = NULL, lease_expires_at = NULL,
      pause_reason = 'tool outcome unknown: ' || $6, last_event_id = $7, updated_at = clock_timestamp()
  WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3
    AND r.status = ANY($5::text[]) AND r.current_step_key = $4
    AND r.lease_expires_at > clock_timestamp()
    AND r.cancel_requested_at IS NULL
    AND EXISTS (SELECT 1 FROM tool_executions AS te
                WHERE te.run_id = r.id AND te.step_key = $4 AND te.status = 'OUTBOUND_INTENT')
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token
), execution AS (
  UPDATE tool_executions AS te
  SET status = 'IN_DOUBT', error_code = $6
  FROM run
  WHERE te.run_id = $1 AND te.run_id = run.id AND te.step_key = $4 AND te.status = 'OUTBOUND_INTENT'
  RETURNING te.id
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT $7, id, tenant_id, 'agent.tool_in_doubt',
         jsonb_build_object('step_key', $4::text, 'error_code', $6::text, 'detail', $8::text),
         fencing_token, version, $9, $10, $11, $12::bytea
  FROM run
)
SELECT run.version, run.tenant_id,
       agentrt_assert((SELECT count(*) FROM execution) = 1, 'tool ledger row was not open') AS ok
FROM run;

-- name: finish_run
-- Ends the holder's turn: COMPLETED / FAILED / PAUSED_HUMAN ($6), or back to
-- QUEUED for a retry with backoff or a durable sleep. A retry at max_attempts
-- goes to $12 (FAILED or PAUSED_HUMAN) instead. The lease is always cleared.
-- $7 = 'retry' | 'sleep' | 'end'. Sleep and resume reset attempt_count: it counts
-- claims since the run last made progress on its own terms.
WITH run AS (
  UPDATE agent_runs AS r
  SET status = CASE
        WHEN $7 = 'retry' AND r.attempt_count >= r.max_attempts THEN $12
        WHEN $7 IN ('retry', 'sleep') THEN 'QUEUED'
        ELSE $6 END,
      lease_owner = NULL, lease_expires_at = NULL,
      next_attempt_at = CASE
        WHEN $7 = 'retry' THEN clock_timestamp()
          + make_interval(secs => agentrt_backoff_ms(r.id, r.attempt_count, $9, $10, $11) / 1000)
        WHEN $7 = 'sleep' THEN clock_timestamp() + make_interval(secs => $8::double precision / 1000)
        ELSE r.next_attempt_at END,
      attempt_count = CASE WHEN $7 = 'sleep' THEN 0 ELSE r.attempt_count END,
      result = CASE WHEN $7 = 'end' AND $6 = 'COMPLETED' THEN $13::jsonb ELSE r.result END,
      terminal_reason = CASE
        WHEN $7 = 'retry' AND r.attempt_count >= r.max_attempts AND $12 = 'FAILED'
          THEN 'attempts exhausted (' || r.attempt_count || '/' || r.max_attempts || '): ' || $14
        WHEN $7 = 'end' AND $6 IN ('COMPLETED', 'FAILED') THEN $14
        ELSE r.terminal_reason END,
      pause_reason = CASE
        WHEN $7 = 'retry' AND r.attempt_count >= r.max_attempts AND $12 = 'PAUSED_HUMAN'
          THEN 'attempts exhausted (' || r.attempt_count || '/' || r.max_attempts || '): ' || $14
        WHEN $7 = 'end' AND $6 = 'PAUSED_HUMAN' THEN $14
        WHEN $7 = 'sleep' THEN NULL
        ELSE r.pause_reason END,
      finished_at = CASE
        WHEN ($7 = 'end' AND $6 IN ('COMPLETED', 'FAILED'))
          OR ($7 = 'retry' AND r.attempt_count >= r.max_attempts AND $12 = 'FAILED')
        THEN clock_timestamp() ELSE NULL END,
      last_event_id = $15, updated_at = clock_timestamp()
  WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3 AND r.version = $4
    AND r.status = ANY($5::text[])
    AND r.lease_expires_at > clock_timestamp()
    AND r.cancel_requested_at IS NULL
  RETURNING r.id, r.tenant_id, r.version, r.fencing_token, r.status, r.next_attempt_at,
            r.attempt_count, r.agent_name
), event AS (
  INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                      traceparent, tracestate, write_op, write_hash)
  SELECT $15, id, tenant_id,
         CASE status WHEN 'COMPLETED' THEN 'agent.run_completed'
                     WHEN 'FAILED' THEN 'agent.run_failed'
                     WHEN 'PAUSED_HUMAN' THEN 'agent.run_paused'
                     ELSE CASE WHEN $7 = 'sleep' THEN 'agent.run_sleeping' ELSE 'agent.run_retry_scheduled' END
         END,
         jsonb_build_object('status', status, 'reason', $14::text, 'error_class', $16::text,
                            'next_attempt_at', CASE WHEN status = 'QUEUED' THEN next_attempt_at END,
                            'attempt_count', attempt_count),
         fencing_token, version, $17, $18, $19, $20::bytea
  FROM run
)
SELECT run.status, run.next_attempt_at, run.version, run.tenant_id FROM run;

-- name: lock_run
-- Operator paths (cancel, resume, resolve) and error diagnosis lock the row
-- first, check the transition table in code, then write.
SELECT *, lease_expires_at > clock_timestamp() AS lease_live, clock_timestamp() AS db_now
FROM agent_runs WHERE id = $1 FOR UPDATE;

-- name: read_run
-- Unlocked read used to explain why a fenced write matched no row.
SELECT *, lease_expires_at > clock_timestamp() AS lease_live, clock_timestamp() AS db_now
FROM agent_runs WHERE id = $1;

-- name: end_run
-- Ends a locked run at once (cancel of an unleased run, cancel applied at the
-- holder's write or at claim, deadline passed at claim, approval rejected).
-- The lease is cleared with the transition (invariant 1). A terminal run holds
-- no open intent: a tool call still OUTBOUND_INTENT (its holder died or never
-- reported) becomes IN_DOUBT in the same statement, for reconciliation.
WITH ended AS (
  UPDATE agent_runs
  SET status = 'FAILED', lease_owner = NULL, lease_expires_at = NULL,
      terminal_reason = $2, finished_at = clock_timestamp(), updated_at = clock_timestamp(),
      cancel_requested_at = CASE WHEN $3 THEN COALESCE(cancel_requested_at, clock_timestamp())
                                 ELSE cancel_requested_at END,
      cancel_reason = CASE WHEN $3 THEN COALESCE(cancel_reason, $4) ELSE cancel_reason END
  WHERE id = $1 AND status NOT IN ('COMPLETED', 'FAILED')
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
SET cancel_requested_at = clock_timestamp(), cancel_reason = $2, updated_at = clock_timestamp()
WHERE id = $1 AND status IN ('RUNNING', 'WAITING_TOOL') AND cancel_requested_at IS NULL
RETURNING *;

-- name: resume_run
-- PAUSED_HUMAN -> QUEUED with the operator's response recorded for the next step.
UPDATE agent_runs
SET status = 'QUEUED', human_input = $2, pause_reason = NULL, attempt_count = 0,
    next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = $1 AND status = 'PAUSED_HUMAN'
RETURNING *;

-- name: freeze_run
-- Commit-unknown recovery found half a write: stop the run, never guess.
UPDATE agent_runs
SET status = 'PAUSED_INDOUBT', lease_owner = NULL, lease_expires_at = NULL,
    pause_reason = $2, updated_at = clock_timestamp()
WHERE id = $1 AND status IN ('RUNNING', 'WAITING_TOOL')
RETURNING *;

-- name: requeue_resolved
-- A resolved in-doubt run goes back to QUEUED; with a new checkpoint when the
-- resolution carried a result ($2 = new version, else the version is kept),
-- and $3 journal entries appended in the same (locked) transaction.
UPDATE agent_runs
SET status = 'QUEUED', version = $2, pause_reason = NULL, attempt_count = 0,
    journal_length = journal_length + $3,
    next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = $1 AND status = 'PAUSED_INDOUBT'
RETURNING *;

-- name: append_journal_entry
-- One journal entry written by an operator path (resolution), in the locked
-- run's transaction: $2 is the run's journal_length + 1, so the journal stays
-- gapless, and the primary key refuses a seq already written.
INSERT INTO run_journal (run_id, seq, kind, step_key, node, tool, detail, fencing_token, run_version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: notify_work
-- Wakes long-polling claimers (delivered at commit).
SELECT pg_notify('agentrt_work', $1);

-- name: bump_counter
-- Counts an event an operator must see (e.g. a commit-unknown freeze).
INSERT INTO runtime_counters (name, value) VALUES ($1, 1)
ON CONFLICT (name) DO UPDATE SET value = runtime_counters.value + 1, updated_at = clock_timestamp();

-- name: get_counter
SELECT value FROM runtime_counters WHERE name = $1;

-- name: insert_event
-- One outbox row, written in the same transaction as the change it announces.
-- $10/$11 bind a caller-chosen event id to its write (operation, request hash).
INSERT INTO outbox (event_id, run_id, tenant_id, event_type, payload, fencing_token, run_version,
                    traceparent, tracestate, write_op, write_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: insert_checkpoint
-- A checkpoint written by an operator path (resolution), in the run's transaction.
INSERT INTO agent_checkpoints (run_id, version, state_json, state_hash, schema_version, fencing_token, event_id)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: latest_checkpoint
SELECT * FROM agent_checkpoints WHERE run_id = $1 ORDER BY version DESC LIMIT 1;

-- name: tool_execution_for_step
SELECT * FROM tool_executions WHERE run_id = $1 AND step_key = $2;

-- name: lock_tool_execution
SELECT * FROM tool_executions WHERE run_id = $1 AND step_key = $2 FOR UPDATE;

-- name: tool_execution_by_key
SELECT * FROM tool_executions WHERE tool_name = $1 AND idempotency_key = $2;

-- name: resolve_tool_execution
-- Records an operator's or reconciler's evidence on an in-doubt ledger row.
-- The row is never deleted; UNKNOWN keeps it IN_DOUBT with the evidence added.
UPDATE tool_executions
SET status = $3, response_json = COALESCE($4, response_json),
    remote_resource_id = COALESCE($5, remote_resource_id),
    reconciliation_evidence = $6, resolved_by = $7, reconciled_at = clock_timestamp(),
    completed_at = CASE WHEN $3 IN ('SUCCEEDED', 'FAILED', 'NOT_EXECUTED') THEN clock_timestamp() END
WHERE run_id = $1 AND step_key = $2 AND status = 'IN_DOUBT'
RETURNING *;

-- name: close_open_execution
-- Used when a cancelled run's holder reports its tool outcome: the fact is
-- kept in the ledger even though the run ends.
UPDATE tool_executions
SET status = $3, response_json = $4, remote_resource_id = $5, error_code = $6,
    completed_at = CASE WHEN $3 = 'IN_DOUBT' THEN NULL ELSE clock_timestamp() END
WHERE run_id = $1 AND step_key = $2 AND status = 'OUTBOUND_INTENT'
RETURNING *;

-- name: run_by_last_event
-- Commit-unknown recovery: the run half of a write that leaves no other row.
SELECT id AS run_id, fencing_token FROM agent_runs WHERE id = $1 AND last_event_id = $2;

-- name: event_by_id
SELECT * FROM outbox WHERE event_id = $1;

-- name: checkpoint_by_event
SELECT * FROM agent_checkpoints WHERE event_id = $1;

-- name: tool_execution_by_intent_event
SELECT * FROM tool_executions WHERE intent_event_id = $1;

-- name: history_checkpoints
-- One page of a run's checkpoints after version $2 (primary key order).
SELECT *, octet_length(state_json::text) AS page_bytes
FROM agent_checkpoints WHERE run_id = $1 AND version > $2 ORDER BY version LIMIT $3;

-- name: history_tool_executions
-- One page of a run's ledger rows after ($2, $3) in intent order. The
-- '-infinity' condition (true of every row) selects the partial index
-- tool_executions_run_intent_idx, which no ledger write can use.
SELECT *, octet_length(request_json::text) + coalesce(octet_length(response_json::text), 0)
         + coalesce(octet_length(reconciliation_evidence::text), 0) AS page_bytes
FROM tool_executions
WHERE run_id = $1 AND outbound_intent_at > '-infinity'::timestamptz
  AND ($2::timestamptz IS NULL OR (outbound_intent_at, id) > ($2, $3::uuid))
ORDER BY outbound_intent_at, id LIMIT $4;

-- name: history_journal
-- One page of a run's journal entries after seq $2 (primary key order). The
-- detail goes out as the text jsonb prints: no decoding and encoding per entry.
SELECT seq, kind, step_key, node, tool, detail::text AS detail_text, run_version, created_at,
       octet_length(detail::text) AS page_bytes
FROM run_journal WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3;

-- name: read_journal
-- ReadJournal: entries after seq $4, only while ($2, $3) holds the run's lease,
-- live by database time. A read: it never writes, and an empty answer is
-- explained by the caller (no entries, or not the holder).
SELECT j.seq, j.kind, j.step_key, j.node, j.tool, j.detail::text AS detail_text, j.run_version,
       j.created_at, octet_length(j.detail::text) AS page_bytes
FROM run_journal AS j
WHERE j.run_id = $1 AND j.seq > $4
  AND EXISTS (SELECT 1 FROM agent_runs AS r
              WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3
                AND r.lease_expires_at > clock_timestamp())
ORDER BY j.seq LIMIT $5;

-- name: read_journal_compact
-- ReadJournal with compact set: the page as one JSON array text, cut after $5
-- entries or once the entries' details pass $6 bytes (one entry at least), and
-- how many entries were read past the cut (0: no more). Same lease condition
-- as read_journal.
WITH page AS (
  SELECT j.seq, json_build_array(j.seq, j.kind, j.step_key, j.node, j.tool, j.detail) AS item,
         row_number() OVER (ORDER BY j.seq) AS n,
         sum(octet_length(j.detail::text)) OVER (ORDER BY j.seq) AS running
  FROM run_journal AS j
  WHERE j.run_id = $1 AND j.seq > $4
    AND EXISTS (SELECT 1 FROM agent_runs AS r
                WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3
                  AND r.lease_expires_at > clock_timestamp())
  ORDER BY j.seq LIMIT $5 + 1
)
SELECT coalesce((json_agg(item ORDER BY seq) FILTER (WHERE n <= $5 AND (n = 1 OR running <= $6)))::text,
                '[]') AS items,
       count(*) FILTER (WHERE NOT (n <= $5 AND (n = 1 OR running <= $6))) AS beyond,
       count(*) AS fetched
FROM page;

-- name: tool_results_for_steps
-- GetToolResults: the holder's ledger rows of steps $4 (the (run_id, step_key)
-- unique index), under the same live-lease condition as read_journal.
SELECT te.*, octet_length(te.request_json::text) + coalesce(octet_length(te.response_json::text), 0)
         + coalesce(octet_length(te.reconciliation_evidence::text), 0) AS page_bytes
FROM tool_executions AS te
WHERE te.run_id = $1 AND te.step_key = ANY($4::text[])
  AND EXISTS (SELECT 1 FROM agent_runs AS r
              WHERE r.id = $1 AND r.lease_owner = $2 AND r.fencing_token = $3
                AND r.lease_expires_at > clock_timestamp());

-- name: prune_checkpoints
-- Checkpoint pruning (checkpoint_keep_last = $3 > 0), one short statement:
-- up to $2 runs after id $1 in primary-key order; of each, the checkpoints
-- older than its latest $3 versions, at most $4 versions per run. A run whose
-- row is locked (a write in flight) is skipped until the next pass. Every
-- version has a checkpoint, so versions above version - $3 are never touched;
-- the horizon is recorded on the run row in the same statement, so
-- commit-unknown recovery reads a checkpoint missing at or below it as pruned
-- (checkpoints_pruned_through is not indexed: the update stays HOT).
WITH batch AS (
  SELECT id FROM agent_runs WHERE id > $1 ORDER BY id LIMIT $2
), due AS (
  SELECT r.id, r.checkpoints_pruned_through AS previous,
         least(r.version - $3, r.checkpoints_pruned_through + $4) AS horizon,
         r.version - $3 > r.checkpoints_pruned_through + $4 AS behind
  FROM agent_runs AS r JOIN batch ON batch.id = r.id
  WHERE r.version - $3 > r.checkpoints_pruned_through
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
-- One page of a run's outbox events after id $2 (outbox_run_idx).
SELECT *, octet_length(payload::text) AS page_bytes FROM outbox WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3;

-- name: tenant_stats
-- Operator view (agentrt status): counts and ages by database time, one tenant.
-- Reads only; uses the tenant/status index and the pending-outbox partial index.
SELECT
  (SELECT coalesce(jsonb_object_agg(status, n), '{}'::jsonb)
     FROM (SELECT status, count(*) AS n FROM agent_runs WHERE tenant_id = $1 GROUP BY status) s) AS by_status,
  (SELECT extract(epoch FROM clock_timestamp() - min(next_attempt_at)) FROM agent_runs
    WHERE tenant_id = $1 AND status = 'QUEUED' AND next_attempt_at <= clock_timestamp()) AS oldest_queued_s,
  (SELECT count(*) FROM agent_runs WHERE tenant_id = $1 AND status = 'PAUSED_INDOUBT') AS in_doubt,
  (SELECT extract(epoch FROM clock_timestamp() - min(updated_at)) FROM agent_runs
    WHERE tenant_id = $1 AND status = 'PAUSED_INDOUBT') AS oldest_in_doubt_s,
  (SELECT count(*) FROM outbox WHERE tenant_id = $1 AND published_at IS NULL) AS outbox_pending,
  (SELECT extract(epoch FROM clock_timestamp() - min(created_at)) FROM outbox
    WHERE tenant_id = $1 AND published_at IS NULL) AS outbox_oldest_s,
  clock_timestamp() AS db_now;

-- name: global_stats
-- Metrics (all tenants): runs by status, queue/in-doubt ages, outbox lag, and
-- the commit-unknown counter. Reads only; refreshed on an interval, not per scrape.
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
    AS commit_unknown_inconsistent;
