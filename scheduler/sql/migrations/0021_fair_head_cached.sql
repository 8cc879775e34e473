-- 0021: a submit's fair-share pass without replanning (docs/flow-control.md).
--
-- agentrt_fair_head (0016) was a SQL function with a SET clause: PostgreSQL
-- cannot inline such a function, and before version 18 it plans a SQL
-- function's statement again on every call. On PostgreSQL 15, each submit
-- with fair share on paid about 0.13 ms of backend time for that (measured
-- with pgbench: 0.21 ms a call against 0.09 ms for a bare SELECT 1). The same
-- read in PL/pgSQL keeps its plan for the session. It has the same name,
-- arguments, result, work scope and grants (CREATE OR REPLACE keeps them).
CREATE OR REPLACE FUNCTION agentrt_fair_head(at_priority integer) RETURNS float8
LANGUAGE plpgsql STABLE SET agentrt.scope = 'work' AS $$
BEGIN
  RETURN (SELECT h.fair_pass FROM agent_runs AS h
          WHERE h.status = 'QUEUED' AND h.claim_ready AND h.priority = at_priority
          ORDER BY h.priority DESC, h.fair_pass, h.enqueued_at, h.id LIMIT 1);
END
$$;
