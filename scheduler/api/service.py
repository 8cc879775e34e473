"""RPC handlers for RunService (public, tenant-scoped: scheduler/api/run_service.py) and WorkService
(executors: scheduler/api/work_service.py), with what they share in scheduler/api/rpc.py.
"""

from __future__ import annotations

from scheduler.api.rpc import batch_error, new_event_id, rpc
from scheduler.api.run_service import RunServicer
from scheduler.api.work_service import WorkServicer

__all__ = ["RunServicer", "WorkServicer", "batch_error", "new_event_id", "rpc"]
