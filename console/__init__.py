"""The operator console: server-rendered pages over the scheduler's RunService (docs/console.md).

It holds no database connection: every page and action is one or more RunService calls made with
the signed-in person's own credential, so the scheduler authorises each of them.
"""
