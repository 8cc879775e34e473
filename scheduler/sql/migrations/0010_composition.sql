-- 0010: composition (issue 19). CANCELLED is a terminal status of its own.
--
-- Until now a cancelled run ended FAILED with terminal_reason 'cancelled: …'
-- and cancel_requested_at set (by the cancel itself, or by the request its
-- holder's write or a claim then applied). Those runs move to CANCELLED; a
-- run that failed for another reason keeps FAILED.
ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_status_check;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_status_check CHECK (
  status IN ('QUEUED', 'RUNNING', 'WAITING_TOOL', 'PAUSED_INDOUBT', 'PAUSED_HUMAN', 'COMPLETED', 'FAILED',
             'CANCELLED'));
ALTER TABLE agent_runs DROP CONSTRAINT finished_only_when_terminal;
ALTER TABLE agent_runs ADD CONSTRAINT finished_only_when_terminal CHECK (
  (status IN ('COMPLETED', 'FAILED', 'CANCELLED')) = (finished_at IS NOT NULL));

UPDATE agent_runs SET status = 'CANCELLED'
WHERE status = 'FAILED' AND cancel_requested_at IS NOT NULL AND terminal_reason LIKE 'cancelled: %';

-- Signals (RunService.SignalRun): named messages queued for a run that has not
-- ended, each consumed exactly once by the checkpoint that records it (the
-- consuming write marks the row under its fence and version, in its own
-- statement). `id` orders them (Signal.seq). (run_id, request_id) makes
-- SignalRun idempotent; request_hash refuses the id reused for another signal.
CREATE TABLE run_signals (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  signal_id uuid NOT NULL UNIQUE,
  run_id uuid NOT NULL REFERENCES agent_runs(id),
  tenant_id text NOT NULL,
  name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  payload jsonb,
  request_id text NOT NULL CHECK (length(request_id) BETWEEN 1 AND 200),
  request_hash bytea NOT NULL CHECK (length(request_hash) = 32),
  received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  consumed_at timestamptz,
  -- The checkpoint (run version) and fence that consumed it.
  consumed_version bigint,
  consumed_fencing_token bigint,
  CONSTRAINT consumed_by_a_checkpoint CHECK (
    (consumed_at IS NULL) = (consumed_version IS NULL) AND (consumed_at IS NULL) = (consumed_fencing_token IS NULL)),
  UNIQUE (run_id, request_id)
);

-- A claim reads the run's pending signals: one probe of this partial index.
CREATE INDEX run_signals_pending_idx ON run_signals (run_id, id) WHERE consumed_at IS NULL;

-- On the run row, so that the writes that park a run and queue a signal meet
-- on one locked row (never on a snapshot of run_signals): the seq of the latest
-- signal received, and while a run sleeps waiting for a signal, its name.
-- Neither is indexed (HOT updates, migration 0004).
ALTER TABLE agent_runs ADD COLUMN last_signal_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE agent_runs ADD COLUMN awaiting_signal text;

-- Schedules (RunService.CreateSchedule ...): a run submitted per fire time.
-- next_fire_at is the nominal fire time; due_at adds the schedule's jitter.
-- A replica fires a due schedule under FOR UPDATE SKIP LOCKED, submitting the
-- run with client_request_id 'schedule:<id>:<nominal fire time>' in the same
-- transaction that moves next_fire_at on: two replicas never fire one time
-- twice, and a retried fire finds its run. buffered_fire_at holds the one fire
-- the buffer_one overlap policy keeps while the previous run is not over.
CREATE TABLE agent_schedules (
  id uuid PRIMARY KEY,
  tenant_id text NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
  name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  agent_name text NOT NULL,
  agent_version text NOT NULL DEFAULT '',
  input jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(input) = 'object'),
  labels jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(labels) = 'object'),
  interval_ms bigint CHECK (interval_ms IS NULL OR interval_ms >= 1000),
  cron text,
  time_zone text NOT NULL DEFAULT 'UTC',
  overlap text NOT NULL CHECK (overlap IN ('SKIP', 'BUFFER_ONE', 'ALLOW_ALL')),
  catch_up_window_ms bigint NOT NULL CHECK (catch_up_window_ms >= 0),
  jitter_ms bigint NOT NULL DEFAULT 0 CHECK (jitter_ms >= 0),
  paused boolean NOT NULL DEFAULT false,
  next_fire_at timestamptz NOT NULL,
  due_at timestamptz NOT NULL,
  buffered_fire_at timestamptz,
  last_run_id uuid,
  last_fire_at timestamptz,
  fires bigint NOT NULL DEFAULT 0,
  skipped bigint NOT NULL DEFAULT 0,
  spec_hash bytea NOT NULL CHECK (length(spec_hash) = 32),
  created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT interval_or_cron CHECK ((interval_ms IS NULL) <> (cron IS NULL)),
  UNIQUE (tenant_id, name)
);

-- The firer's scan: due, unpaused schedules (and those holding a buffered fire).
CREATE INDEX agent_schedules_due_idx ON agent_schedules (due_at) WHERE NOT paused;
