-- agentrt relay: every runtime query, as named blocks (parsed once at import
-- by relay/store.py with scheduler.store.queries.parse_named_queries).
-- No query here holds a row lock or a transaction while the relay waits on
-- Kafka: a claim is a plain read checked against the shard lease, and the mark
-- is a separate statement issued after the broker's acknowledgement.

-- name: ensure_config
-- The first relay fixes the shard count; later relays read it back and refuse
-- to run with another one (rows would change shard, and per-run order with it).
WITH inserted AS (
  INSERT INTO relay_config (id, shard_count) VALUES (1, $1)
  ON CONFLICT (id) DO NOTHING
  RETURNING shard_count
)
SELECT shard_count FROM inserted
UNION ALL
SELECT shard_count FROM relay_config
LIMIT 1;

-- name: read_config
-- ensure_config reads under the snapshot its statement began with: when
-- another relay inserted the row concurrently, the insert does nothing and the
-- read sees no row. A second statement has a fresh snapshot and sees it.
SELECT shard_count FROM relay_config WHERE id = 1;

-- name: ensure_shards
INSERT INTO relay_shards (shard)
SELECT generate_series(0, $1::integer - 1)
ON CONFLICT (shard) DO NOTHING;

-- name: heartbeat_member
-- Keeps this relay in the membership and returns how many relays are alive
-- (itself included), which sets each relay's fair share of shards.
INSERT INTO relay_members (relay_id, expires_at)
VALUES ($1, clock_timestamp() + $2::bigint * interval '1 millisecond')
ON CONFLICT (relay_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
RETURNING 1 + (SELECT count(*) FROM relay_members m
               WHERE m.relay_id <> $1 AND m.expires_at > clock_timestamp()) AS live_members;

-- name: leave_membership
DELETE FROM relay_members WHERE relay_id = $1;

-- name: set_wants_wakeup
-- While true (and the membership unexpired), outbox inserts send a NOTIFY.
UPDATE relay_members SET wants_wakeup = $2 WHERE relay_id = $1;

-- name: renew_shards
-- A renewal succeeds only with the fencing token of the acquisition: once
-- another relay has taken a shard (and so bumped its token) the old holder's
-- renewal matches nothing and it learns it lost the shard.
UPDATE relay_shards s
SET lease_expires_at = clock_timestamp() + $2::bigint * interval '1 millisecond'
FROM unnest($3::integer[], $4::bigint[]) AS held(shard, fencing_token)
WHERE s.shard = held.shard AND s.fencing_token = held.fencing_token AND s.owner = $1
RETURNING s.shard, s.fencing_token;

-- name: acquire_shards
-- Takes up to $3 free or expired shards; each acquisition bumps the token.
WITH free AS (
  SELECT shard FROM relay_shards
  WHERE owner IS NULL OR lease_expires_at <= clock_timestamp()
  ORDER BY shard
  LIMIT $3
  FOR UPDATE SKIP LOCKED
)
UPDATE relay_shards s
SET owner = $1, fencing_token = s.fencing_token + 1, acquired_at = clock_timestamp(),
    lease_expires_at = clock_timestamp() + $2::bigint * interval '1 millisecond'
FROM free
WHERE s.shard = free.shard
RETURNING s.shard, s.fencing_token;

-- name: release_shards
-- Hands shards back at once (rebalancing, shutdown) instead of letting them expire.
UPDATE relay_shards
SET owner = NULL, lease_expires_at = NULL
WHERE owner = $1 AND shard = ANY($2::integer[])
RETURNING shard;

-- name: claim_plan
-- Run (in the claim's short read-only transaction) before claim_batch: with
-- stale statistics after a burst, e.g. a backlog built up while Kafka was down,
-- the planner would bitmap-scan and sort every pending row on every claim.
-- Walking outbox_pending_idx in id order and stopping at the limit is right
-- at any backlog size.
SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off;

-- name: claim_batch
-- The oldest unpublished rows of the shards this relay holds, in id order.
-- Fenced: a shard counts only if (owner, fencing token) still match and the
-- lease is unexpired on the database clock. A run with a PARKED row is left
-- out entirely, so its later events wait behind it. Within one run, ids grow
-- in commit order (the scheduler serialises a run's writes on its row), so a
-- run's rows in this batch are always the oldest unpublished ones of that run.
-- $6: rows Kafka acknowledged whose mark is still in flight (not pending any more).
-- Shape matters for speed: the held shards collapse into one array so the
-- planner walks outbox_pending_idx in id order and stops at the limit;
-- per-row extras (retry flag, text formatting) are computed for the batch only.
WITH held AS MATERIALIZED (
  SELECT coalesce(array_agg(s.shard), '{}') AS shards
  FROM relay_shards s
  JOIN unnest($2::integer[], $3::bigint[]) AS mine(shard, fencing_token)
    ON mine.shard = s.shard AND mine.fencing_token = s.fencing_token
  WHERE s.owner = $1 AND s.lease_expires_at > clock_timestamp()
), batch AS (
  SELECT o.* FROM outbox o
  WHERE o.published_at IS NULL
    AND o.id <> ALL ($6::bigint[])
    AND agentrt_outbox_shard(o.run_id, $4::integer) = ANY ((SELECT shards FROM held)::integer[])
    AND NOT EXISTS (SELECT 1 FROM outbox_parked p WHERE p.run_id = o.run_id AND p.state = 'PARKED')
  ORDER BY o.id
  LIMIT $5
)
-- Ids, time and payload come back as text, formatted here once (cheaper than in Python).
SELECT b.id, b.event_id::text AS event_id, b.run_id::text AS run_id, b.tenant_id, b.event_type,
       b.payload::text AS payload_json, b.fencing_token, b.run_version, b.traceparent, b.tracestate,
       to_char(b.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS time_text,
       floor(extract(epoch FROM b.created_at) * 1000)::bigint AS created_ms,
       EXISTS (SELECT 1 FROM outbox_parked r WHERE r.outbox_id = b.id AND r.state = 'RETRY') AS retrying
FROM batch b
ORDER BY b.id;

-- name: mark_published
-- Only after the broker acknowledged every id in $1. Deliberately not fenced:
-- an acknowledged event is in Kafka whoever holds the shard now, and marking
-- it only saves a duplicate.
UPDATE outbox SET published_at = clock_timestamp()
WHERE id = ANY($1::bigint[]) AND published_at IS NULL;

-- name: mark_retries_delivered
UPDATE outbox_parked SET state = 'DELIVERED'
WHERE outbox_id = ANY($1::bigint[]) AND state = 'RETRY';

-- name: park_row
-- The broker (or the size limit in front of it) refused this row for good.
-- Parked once per refusal: a row already PARKED is left as it is, a RETRY
-- that fails again goes back to PARKED with its count raised. Counted in
-- runtime_counters only when this statement parked it.
WITH parked AS (
  INSERT INTO outbox_parked AS p (outbox_id, event_id, run_id, tenant_id, event_type, state, reason, parked_by)
  SELECT o.id, o.event_id, o.run_id, o.tenant_id, o.event_type, 'PARKED', $2, $3
  FROM outbox o
  WHERE o.id = $1 AND o.published_at IS NULL
  ON CONFLICT (outbox_id) DO UPDATE
    SET state = 'PARKED', reason = EXCLUDED.reason, parked_by = EXCLUDED.parked_by,
        park_count = p.park_count + 1, last_parked_at = clock_timestamp()
    WHERE p.state = 'RETRY'
  RETURNING p.park_count
), counted AS (
  INSERT INTO runtime_counters (name, value)
  SELECT 'relay_outbox_parked', 1 FROM parked
  ON CONFLICT (name) DO UPDATE
    SET value = runtime_counters.value + 1, updated_at = clock_timestamp()
)
SELECT park_count FROM parked;

-- name: list_parked
SELECT p.*, o.published_at
FROM outbox_parked p LEFT JOIN outbox o ON o.id = p.outbox_id
WHERE ($1::text IS NULL OR p.state = $1)
ORDER BY p.outbox_id
LIMIT $2;

-- name: retry_parked
-- Operator: let the relay try a parked row again (it goes first in its run). Audited in the
-- same statement: the operator at a shell with the database URL is a `local:` principal.
WITH retried AS (
  UPDATE outbox_parked
  SET state = 'RETRY', resolved_by = $2, resolution_note = $3, resolved_at = clock_timestamp()
  WHERE outbox_id = $1 AND state = 'PARKED'
  RETURNING *
), audited AS (
  INSERT INTO audit_log (audit_id, principal, principal_kind, tenant_id, action, run_id, reason,
                         state_before, state_after, evidence)
  SELECT gen_random_uuid(), 'local:' || $2, 'local', r.tenant_id, 'outbox.retry', r.run_id, $3,
         jsonb_build_object('state', 'PARKED', 'outbox_id', r.outbox_id),
         jsonb_build_object('state', 'RETRY', 'outbox_id', r.outbox_id),
         jsonb_build_object('event_id', r.event_id, 'event_type', r.event_type, 'parked_reason', r.reason)
  FROM retried r
)
SELECT * FROM retried;

-- name: skip_parked
-- Operator: give up on a parked row. It leaves the outbox's pending set
-- (published_at is set: "left the outbox", not "reached Kafka"; this table
-- records that it was skipped, by whom and why), and its run's later
-- events flow again.
WITH skipped AS (
  UPDATE outbox_parked
  SET state = 'SKIPPED', resolved_by = $2, resolution_note = $3, resolved_at = clock_timestamp()
  WHERE outbox_id = $1 AND state = 'PARKED'
  RETURNING *
), gone AS (
  UPDATE outbox o SET published_at = clock_timestamp()
  FROM skipped WHERE o.id = skipped.outbox_id AND o.published_at IS NULL
  RETURNING o.id
), counted AS (
  INSERT INTO runtime_counters (name, value)
  SELECT 'relay_outbox_skipped', 1 FROM skipped
  ON CONFLICT (name) DO UPDATE
    SET value = runtime_counters.value + 1, updated_at = clock_timestamp()
), audited AS (
  INSERT INTO audit_log (audit_id, principal, principal_kind, tenant_id, action, run_id, reason,
                         state_before, state_after, evidence)
  SELECT gen_random_uuid(), 'local:' || $2, 'local', s.tenant_id, 'outbox.skip', s.run_id, $3,
         jsonb_build_object('state', 'PARKED', 'outbox_id', s.outbox_id),
         jsonb_build_object('state', 'SKIPPED', 'outbox_id', s.outbox_id),
         jsonb_build_object('event_id', s.event_id, 'event_type', s.event_type, 'parked_reason', s.reason)
  FROM skipped s
)
SELECT * FROM skipped;

-- name: parked_state
SELECT state FROM outbox_parked WHERE outbox_id = $1;

-- name: outbox_lag
-- What the relay reports: events waiting, the oldest one's age, parked rows.
SELECT count(*) AS pending,
       extract(epoch FROM clock_timestamp() - min(created_at))::double precision AS oldest_age_s,
       (SELECT count(*) FROM outbox_parked WHERE state = 'PARKED') AS parked,
       (SELECT coalesce(max(value), 0) FROM runtime_counters WHERE name = 'relay_outbox_parked')
         AS parked_total
FROM outbox
WHERE published_at IS NULL;

-- name: list_shards
SELECT s.*, s.lease_expires_at > clock_timestamp() AS live FROM relay_shards s ORDER BY shard;

-- name: list_members
SELECT *, expires_at > clock_timestamp() AS live FROM relay_members ORDER BY relay_id;

-- name: retention_cutoff
SELECT clock_timestamp() - $1::double precision * interval '1 second' AS cutoff;

-- name: outbox_first_row_from
-- Retention walks the outbox by id through the primary key: ids grow with
-- created_at (both are taken at insert), so bisecting on this finds the first
-- row created after a cutoff, and it also jumps over gaps left by deletes.
SELECT id, created_at FROM outbox WHERE id >= $1 ORDER BY id LIMIT 1;

-- name: outbox_last_id
SELECT max(id) FROM outbox;

-- name: delete_published_outbox
-- Retention: the rows in ids [$1, $2) published before $3. One short statement
-- over a bounded id range with SKIP LOCKED: never a long lock on the outbox.
-- Unpublished rows (pending or parked) are never deleted.
WITH doomed AS (
  SELECT id FROM outbox
  WHERE id >= $1 AND id < $2 AND published_at IS NOT NULL AND published_at < $3
  FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox o USING doomed WHERE o.id = doomed.id;

-- name: delete_consumed_events
-- Retention of the consumers' dedupe records. Keep them longer than any
-- replay window: an event replayed after its record is gone is applied again.
WITH doomed AS (
  SELECT consumer_name, event_id FROM consumed_events
  WHERE consumed_at < clock_timestamp() - $1::double precision * interval '1 second'
  ORDER BY consumed_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
DELETE FROM consumed_events c USING doomed
WHERE c.consumer_name = doomed.consumer_name AND c.event_id = doomed.event_id;

-- name: primary_probe
-- Readiness (relay/main.py): true when this session's server is a primary that takes writes.
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable;
