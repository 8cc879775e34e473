-- 0002: the relay. Shard leases with their own fencing tokens, relay
-- membership (for balancing and the idle wake-up flag), parked outbox rows
-- with their reasons, and the indexes retention needs.
--
-- Per-run order: every outbox row belongs to the shard of its run
-- (agentrt_outbox_shard), a shard is leased to one relay at a time, and a
-- relay publishes a run's pending rows in id order starting from the oldest
-- unpublished one. Acquiring a shard bumps its fencing token; every claim is
-- checked against (owner, fencing token, unexpired lease) on the database clock.

-- One row: the shard count every relay must agree on (a mismatch is refused at start).
CREATE TABLE relay_config (
  id integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
  shard_count integer NOT NULL CHECK (shard_count BETWEEN 1 AND 4096),
  created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE relay_shards (
  shard integer PRIMARY KEY CHECK (shard >= 0),
  owner text,
  -- Grows by one on every acquisition: a relay that lost the shard cannot renew it.
  fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
  lease_expires_at timestamptz,
  acquired_at timestamptz,
  CONSTRAINT shard_owner_with_expiry CHECK ((owner IS NULL) = (lease_expires_at IS NULL))
);

CREATE TABLE relay_members (
  relay_id text PRIMARY KEY CHECK (length(relay_id) BETWEEN 1 AND 200),
  started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  expires_at timestamptz NOT NULL,
  -- Set while this relay sleeps with nothing to do: only then do outbox
  -- inserts send a NOTIFY (see agentrt_outbox_wake_relay).
  wants_wakeup boolean NOT NULL DEFAULT false
);

-- Stable for a given shard count; the operator can ask which shard a run is in.
CREATE FUNCTION agentrt_outbox_shard(run_id uuid, shard_count integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ((hashtextextended(run_id::text, 0) & 9223372036854775807) % shard_count)::integer
$$;

-- A NOTIFY makes every notifying commit take a cluster-wide lock until after
-- its WAL flush, which serialises commits (measured: 8 writers fall from
-- ~1,900 to ~230 inserts/s). So an insert notifies only while some live relay
-- sleeps idle; a busy relay polls and needs no wake-up.
CREATE FUNCTION agentrt_outbox_wake_relay() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM relay_members
             WHERE wants_wakeup AND expires_at > clock_timestamp()) THEN
    PERFORM pg_notify('agentrt_outbox', '');
  END IF;
  RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_wake_relay AFTER INSERT ON outbox
  FOR EACH STATEMENT EXECUTE FUNCTION agentrt_outbox_wake_relay();

-- A row the broker refused for good. While a run has a PARKED row, the relay
-- publishes none of that run's later rows (order is never broken); RETRY lets
-- the relay try it again; SKIPPED is the operator's decision to drop it (the
-- outbox row is then marked as gone, this row keeps the evidence).
CREATE TABLE outbox_parked (
  outbox_id bigint PRIMARY KEY,
  event_id uuid NOT NULL,
  run_id uuid NOT NULL,
  tenant_id text NOT NULL,
  event_type text NOT NULL,
  state text NOT NULL CHECK (state IN ('PARKED', 'RETRY', 'SKIPPED', 'DELIVERED')),
  reason text NOT NULL,
  park_count integer NOT NULL DEFAULT 1 CHECK (park_count > 0),
  first_parked_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  last_parked_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  parked_by text NOT NULL,
  resolved_by text,
  resolution_note text,
  resolved_at timestamptz,
  -- Retrying or skipping is an operator's act: it names who did it and when.
  CONSTRAINT resolution_has_operator CHECK (
    state NOT IN ('RETRY', 'SKIPPED') OR (resolved_by IS NOT NULL AND resolved_at IS NOT NULL))
);

CREATE INDEX outbox_parked_blocking_idx ON outbox_parked (run_id) WHERE state = 'PARKED';

-- The outbox is a queue: each row is inserted, marked once, deleted later. The
-- claim walks outbox_pending_idx from its start, so the dead entries every mark
-- leaves behind must be vacuumed away soon, not after 20% of the table.
ALTER TABLE outbox SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 5000,
                        autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.0,
                        autovacuum_analyze_threshold = 20000);

-- Retention of consumed_events goes by age. (Outbox retention needs no index
-- of its own: it bisects ids on created_at through the primary key, so the
-- relay's mark does not pay for one more index entry per event.)
CREATE INDEX consumed_events_consumed_at_idx ON consumed_events (consumed_at);
