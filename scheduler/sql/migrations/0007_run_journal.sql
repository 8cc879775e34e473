-- 0007: a run's history as append-only journal rows (issue 12: long runs at flat cost).
-- A schema-2 checkpoint keeps only current state; the entries it records are
-- appended here by the very statement that writes it, under the same fence,
-- owner, version and live-lease checks. The primary key makes a committed
-- entry impossible to rewrite; the writes refuse any entry that does not
-- continue the journal (first seq = journal_length + 1), so it has no gaps.
CREATE TABLE run_journal (
  run_id uuid NOT NULL REFERENCES agent_runs(id),
  seq bigint NOT NULL CHECK (seq > 0),
  kind text NOT NULL CHECK (kind IN ('tool', 'sleep', 'input', 'approval', 'finish', 'fail', 'exception',
                                     'result', 'answer', 'retry')),
  step_key text NOT NULL DEFAULT '',
  node text NOT NULL DEFAULT '',
  tool text NOT NULL DEFAULT '',
  detail jsonb NOT NULL CHECK (jsonb_typeof(detail) = 'object'),
  -- The fence that wrote it and the run version (checkpoint) that recorded it.
  fencing_token bigint NOT NULL,
  run_version bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (run_id, seq)
);

-- How many entries the run's journal holds, kept by the writes that append
-- them (in the same UPDATE of the run row). Not indexed: an index over it
-- would end the HOT updates of migration 0004.
ALTER TABLE agent_runs ADD COLUMN journal_length bigint NOT NULL DEFAULT 0;

-- Checkpoint pruning (setting checkpoint_keep_last): versions up to this one
-- may have been deleted as superseded. Commit-unknown recovery reads a
-- missing checkpoint at or below it as pruned, not as half a commit. Not indexed.
ALTER TABLE agent_runs ADD COLUMN checkpoints_pruned_through bigint NOT NULL DEFAULT 0;
