"""The scheduler's background work: periodic tasks and notifications beside the RPC handlers.

Retention of finished runs, checkpoint pruning, the LISTEN/NOTIFY claim wakeups, database health
gauges and the index upkeep (`agentrt maintain indexes`). It stands on store/ and the shared rules.
"""
