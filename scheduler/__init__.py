"""The scheduler: sole writer of run state; serves RunService and WorkService.

Its rooms, each floor importing only the floors below it (an import-linter layers contract in
pyproject.toml):

- server.py: assembles the process (pools, services, background tasks, ordered shutdown);
- api/: the gRPC handlers, their wire decoding, validation and conversion, authentication
  (an interceptor-like gate over the key repository), the redaction of sealed values in
  answers, and the Prometheus metrics;
- background/: what runs on a timer or a notification (retention, pruning, LISTEN/NOTIFY
  wakeups, database health, index upkeep);
- store/: the one data-access layer: the Store, its queries (../sql/queries.sql), rows,
  fenced writes and commit-unknown recovery, migrations and the database roles;
- config.py, states.py, bounds.py, flow_limits.py, admission.py, schedule_times.py: settings,
  the run-status transition table and the rules the floors above share;
- security/: the policies and primitives below everything: RBAC roles, JWT verification and
  the sealing of sensitive values (no scheduler imports).
"""
