-- 0024: the checks of the tables a fenced step writes list their allowed values
-- as one array constant, not as an ARRAY of constants (docs/performance/
-- step-profile.md).
--
-- Each statement that writes a row reads every CHECK of the table back from its
-- stored node text and prepares it again (ExecRelCheck). `x IN ('a', 'b', ...)`
-- is stored as `x = ANY (ARRAY['a', 'b', ...])`: one Const node per value, each
-- with its type, collation and location, and then an ArrayExpr to build at
-- every evaluation. `x = ANY ('{a,b,...}'::text[])` is one Const. For
-- run_journal_kind_check the stored text falls from 2,045 to 788 bytes and the
-- backend CPU per committed journal INSERT from 27.1 to 22.4 us (median of
-- nine rounds, PostgreSQL 15). Same names, same values, same refusals.
ALTER TABLE run_journal
  DROP CONSTRAINT run_journal_kind_check,
  ADD CONSTRAINT run_journal_kind_check
    CHECK (kind = ANY ('{tool,sleep,input,approval,finish,fail,exception,result,answer,retry}'::text[]));

ALTER TABLE tool_executions
  DROP CONSTRAINT tool_executions_status_check,
  DROP CONSTRAINT completed_when_closed,
  ADD CONSTRAINT tool_executions_status_check
    CHECK (status = ANY ('{OUTBOUND_INTENT,SUCCEEDED,FAILED,IN_DOUBT,NOT_EXECUTED}'::text[])),
  ADD CONSTRAINT completed_when_closed
    CHECK ((status = ANY ('{SUCCEEDED,FAILED,NOT_EXECUTED}'::text[])) = (completed_at IS NOT NULL));
