"""The fault-injection acceptance suite and the chaos soak (docs/design.md §acceptance-and-evidence), on real processes.

`agentrt acceptance` runs experiments 1-9 (docs/evidence.md), each repeated with fresh
run ids: the scheduler, executors, relay, consumer and mock tool server as
separate OS processes, an embedded PostgreSQL the suite starts (so
`pg_ctl restart -m immediate` is possible), a Tansu broker, faults injected at
named points (shared.faults) or by signals. Every repetition writes an evidence
record with the fields docs/design.md §acceptance-and-evidence lists under the artifacts directory.

`agentrt chaos` is the soak: many runs, random SIGKILLs, one PostgreSQL and one
broker restart, then invariant checks over the database, the mock tool's store
and the consumer's table.

Modules: procs (processes by pid), evidence (records, versions, summary),
lab (one experiment's stack), api (gRPC client), agents (definitions),
invariants (SQL checks), experiments_* (1-9), runner, chaos, and the process
entry points consumer_app, probe, older_executor.
"""
