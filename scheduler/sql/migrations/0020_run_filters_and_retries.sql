-- 0020: ListRuns' label filter and RetryRun (README: Runs).
--
-- ListRuns filters by labels with `labels @> :labels` (every given key=value);
-- this index answers containment without reading the tenant's runs one by one
-- (jsonb_path_ops: @> only, smaller than the default operator class). labels
-- never changes after insert, so the index ends no HOT update (0004).
CREATE INDEX agent_runs_labels_idx ON agent_runs USING gin (labels jsonb_path_ops);

-- A run made by RetryRun names the FAILED or CANCELLED run it retries. Set once
-- at insert; no foreign key, as parent_run_id: retention may delete the old run first.
ALTER TABLE agent_runs ADD COLUMN retry_of_run_id uuid;
