"""RPC handlers for RunService (public, tenant-scoped: scheduler/run_service.py) and WorkService
(executors: scheduler/work_service.py), with what they share in scheduler/rpc.py.
"""

from __future__ import annotations

from scheduler.rpc import batch_error, new_event_id, rpc
from scheduler.run_service import RunServicer
from scheduler.work_service import WorkServicer

__all__ = ["RunServicer", "WorkServicer", "batch_error", "new_event_id", "rpc"]
