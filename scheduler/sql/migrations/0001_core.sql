-- 0001: the durable core. Runs, checkpoints, the tool-execution ledger, the
-- outbox and the consumer dedupe table, with the reference design's checks.
-- Every timestamp default is clock_timestamp(): the database clock decides.

CREATE TABLE agent_runs (
  id uuid PRIMARY KEY,
  tenant_id text NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
  agent_name text NOT NULL CHECK (length(agent_name) BETWEEN 1 AND 200),
  agent_version text NOT NULL DEFAULT '',
  status text NOT NULL DEFAULT 'QUEUED'
    CHECK (status IN ('QUEUED', 'RUNNING', 'WAITING_TOOL',
                      'PAUSED_INDOUBT', 'PAUSED_HUMAN', 'COMPLETED', 'FAILED')),
  -- CAS version of the checkpoint chain; distinct from the fencing token.
  version bigint NOT NULL DEFAULT 0 CHECK (version >= 0),
  -- Execution generation: grows by one on every claim.
  fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
  lease_owner text,
  lease_expires_at timestamptz,
  next_attempt_at timestamptz NOT NULL DEFAULT '-infinity',
  attempt_count integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
  max_attempts integer NOT NULL DEFAULT 12 CHECK (max_attempts > 0),
  current_step_key text,
  checkpoint_schema_version integer NOT NULL DEFAULT 1,
  model_version text,
  prompt_version text,
  input jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(input) = 'object'),
  labels jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(labels) = 'object'),
  budget_max_steps bigint NOT NULL DEFAULT 0 CHECK (budget_max_steps >= 0),
  budget_max_tokens bigint NOT NULL DEFAULT 0 CHECK (budget_max_tokens >= 0),
  budget_max_cost_usd double precision NOT NULL DEFAULT 0 CHECK (budget_max_cost_usd >= 0),
  deadline_at timestamptz,
  client_request_id text,
  -- SHA-256 of the canonical submit payload: same id + other payload is refused.
  submit_hash bytea,
  result jsonb,
  terminal_reason text,
  pause_reason text,
  human_input jsonb,
  cancel_requested_at timestamptz,
  cancel_reason text,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  finished_at timestamptz,
  -- Invariant 1: only RUNNING and WAITING_TOOL hold a lease, and a lease is
  -- always an owner together with an expiry.
  CONSTRAINT lease_owner_with_expiry CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
  CONSTRAINT lease_only_when_leased_status CHECK (
    (status IN ('RUNNING', 'WAITING_TOOL')) = (lease_owner IS NOT NULL)),
  -- Terminal runs, and only they, carry a finish time.
  CONSTRAINT finished_only_when_terminal CHECK (
    (status IN ('COMPLETED', 'FAILED')) = (finished_at IS NOT NULL)),
  CONSTRAINT client_request_id_with_hash CHECK (
    (client_request_id IS NULL) = (submit_hash IS NULL))
);

CREATE UNIQUE INDEX agent_runs_client_request_idx
  ON agent_runs (tenant_id, client_request_id) WHERE client_request_id IS NOT NULL;
-- Two claim paths, each with its own partial index, so neither scans terminal runs.
CREATE INDEX agent_claim_queued_idx
  ON agent_runs (next_attempt_at, created_at, id) WHERE status = 'QUEUED';
CREATE INDEX agent_claim_expired_idx
  ON agent_runs (lease_expires_at, created_at, id) WHERE status IN ('RUNNING', 'WAITING_TOOL');
CREATE INDEX agent_runs_tenant_status_idx
  ON agent_runs (tenant_id, status, updated_at DESC);
-- Keyset pagination for ListRuns: (created_at, id) within a tenant.
CREATE INDEX agent_runs_tenant_created_idx
  ON agent_runs (tenant_id, created_at DESC, id DESC);

CREATE TABLE agent_checkpoints (
  run_id uuid NOT NULL REFERENCES agent_runs(id),
  version bigint NOT NULL CHECK (version > 0),
  state_json jsonb NOT NULL CHECK (jsonb_typeof(state_json) = 'object'),
  state_hash bytea NOT NULL CHECK (length(state_hash) = 32),
  schema_version integer NOT NULL CHECK (schema_version > 0),
  -- The fence that wrote it, and the caller's event id (commit-unknown recovery).
  fencing_token bigint NOT NULL,
  event_id uuid NOT NULL UNIQUE,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (run_id, version)
);

CREATE TABLE tool_executions (
  id uuid PRIMARY KEY,
  run_id uuid NOT NULL REFERENCES agent_runs(id),
  step_key text NOT NULL,
  tool_name text NOT NULL,
  idempotency_key text NOT NULL,
  request_json jsonb NOT NULL,
  request_hash bytea NOT NULL CHECK (length(request_hash) = 32),
  status text NOT NULL CHECK (status IN
    ('OUTBOUND_INTENT', 'SUCCEEDED', 'FAILED', 'IN_DOUBT', 'NOT_EXECUTED')),
  remote_resource_id text,
  response_json jsonb,
  error_code text,
  fencing_token bigint NOT NULL,
  intent_event_id uuid NOT NULL UNIQUE,
  outbound_intent_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  completed_at timestamptz,
  reconciled_at timestamptz,
  reconciliation_evidence jsonb,
  resolved_by text,
  -- A closed row has a completion time; an open or in-doubt one has none.
  CONSTRAINT completed_when_closed CHECK (
    (status IN ('SUCCEEDED', 'FAILED', 'NOT_EXECUTED')) = (completed_at IS NOT NULL)),
  -- "Not executed" is a claim about the downstream: it needs its evidence.
  CONSTRAINT not_executed_has_evidence CHECK (
    status <> 'NOT_EXECUTED' OR reconciliation_evidence IS NOT NULL),
  UNIQUE (run_id, step_key),
  UNIQUE (tool_name, idempotency_key)
);

CREATE INDEX tool_executions_reconcile_idx
  ON tool_executions (outbound_intent_at) WHERE status IN ('OUTBOUND_INTENT', 'IN_DOUBT');

CREATE TABLE outbox (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event_id uuid NOT NULL UNIQUE,
  run_id uuid NOT NULL REFERENCES agent_runs(id),
  tenant_id text NOT NULL,
  event_type text NOT NULL,
  payload jsonb NOT NULL,
  fencing_token bigint NOT NULL DEFAULT 0,
  run_version bigint NOT NULL DEFAULT 0,
  -- W3C trace context of the transaction that wrote the row, for the relay.
  traceparent text,
  tracestate text,
  published_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX outbox_pending_idx ON outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_run_idx ON outbox (run_id, id);

CREATE TABLE consumed_events (
  consumer_name text NOT NULL,
  event_id uuid NOT NULL,
  consumed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (consumer_name, event_id)
);

-- Counters an operator must see (e.g. commit-unknown inconsistencies frozen).
CREATE TABLE runtime_counters (
  name text PRIMARY KEY,
  value bigint NOT NULL DEFAULT 0,
  updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Fails the whole statement (and so every data-modifying CTE in it) when a
-- multi-part write would otherwise commit half of itself. SQLSTATE AR001.
CREATE FUNCTION agentrt_assert(ok boolean, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION USING ERRCODE = 'AR001', MESSAGE = message;
  END IF;
  RETURN true;
END;
$$;

-- Deterministic backoff: min(base * 2^(attempt-1), cap) + bounded jitter that
-- depends only on (run, attempt), so a retried computation gives the same time.
CREATE FUNCTION agentrt_backoff_ms(run_id uuid, attempt integer, base_ms bigint, cap_ms bigint,
                                   jitter_ms bigint) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
  SELECT least(base_ms * power(2::double precision, greatest(attempt - 1, 0)), cap_ms::double precision)
         + (abs(hashtextextended(run_id::text || ':' || attempt::text, 0)) % (jitter_ms + 1))::double precision
$$;
