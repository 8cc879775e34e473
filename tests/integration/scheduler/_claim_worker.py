"""A fake executor process for tests/integration/scheduler/test_concurrent_claims.py (not a test module).

Claims runs, saves one checkpoint, finishes COMPLETED, and appends one JSON line
per event to --out: {"op": "claim" | "save" | "done" | "abandon" | "lost", "run", "fence",
"worker", ...}. Every --abandon-every-th first claim (fence 1) of a thread is abandoned
without heartbeating, so another worker must take it over after the lease lapses.
Runs until --stop-file exists.

Two modes: `grpc` talks to a scheduler at --addr (several threads per process);
`store` calls scheduler.store.Store directly through its own asyncpg pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))


class Recorder:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, **record: Any) -> None:
        line = json.dumps(record, default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def grpc_thread(args: argparse.Namespace, worker: str, record: Recorder, errors: list[BaseException]) -> None:
    import grpc

    from shared.errors import error_info
    from shared.gen.agentrt.v1 import work_service_pb2 as ws
    from shared.gen.agentrt.v1 import work_service_pb2_grpc as ws_grpc

    stop = Path(args.stop_file)
    first_claims = 0
    try:
        with grpc.insecure_channel(args.addr) as channel:
            work = ws_grpc.WorkServiceStub(channel)
            while not stop.exists():
                reply = work.ClaimWork(ws.ClaimWorkRequest(worker_id=worker, agents=[args.agent], wait_ms=300),
                                       timeout=10)
                if not reply.HasField("lease"):
                    continue
                run = reply.lease.run
                record(op="claim", run=run.run_id, fence=run.fencing_token, worker=worker,
                       version=run.version, status=run.status)
                if run.fencing_token == 1:
                    first_claims += 1
                    if args.abandon_every and first_claims % args.abandon_every == 0:
                        record(op="abandon", run=run.run_id, fence=run.fencing_token, worker=worker)
                        continue
                ref = ws.LeaseRef(run_id=run.run_id, worker_id=worker, fencing_token=run.fencing_token)
                try:
                    saved = work.SaveCheckpoint(ws.SaveCheckpointRequest(
                        lease=ref, expected_version=run.version, schema_version=1, event_id=str(uuid.uuid4()),
                        state_json=json.dumps({"worker": worker, "fence": run.fencing_token})), timeout=10)
                    record(op="save", run=run.run_id, fence=run.fencing_token, worker=worker,
                           version=saved.version)
                    work.FinishRun(ws.FinishRunRequest(
                        lease=ref, expected_version=saved.version, outcome=ws.FINISH_OUTCOME_COMPLETED,
                        result_json=json.dumps({"by": worker}), event_id=str(uuid.uuid4())), timeout=10)
                    record(op="done", run=run.run_id, fence=run.fencing_token, worker=worker)
                except grpc.RpcError as error:
                    info = error_info(error)  # type: ignore[arg-type]
                    if info is None or info.reason != "LEASE_LOST":
                        raise
                    record(op="lost", run=run.run_id, fence=run.fencing_token, worker=worker)
    except BaseException as exc:  # reported by the process's exit code
        errors.append(exc)


async def store_main(args: argparse.Namespace, record: Recorder) -> None:
    from scheduler.config import SchedulerSettings
    from scheduler.store import CheckpointWrite, LeaseRef, RunFinish, Store, connect_pool
    from shared.errors import LeaseLost

    settings = SchedulerSettings(database_url=args.db_url, lease_duration_ms=args.lease_ms)
    pool = await connect_pool(args.db_url, min_size=1, max_size=args.threads)
    store = Store(pool, settings)
    stop = Path(args.stop_file)

    async def loop(worker: str) -> None:
        first_claims = 0
        while not await asyncio.to_thread(stop.exists):
            claimed = await store.work.claim(worker, [args.agent])
            if claimed is None:
                await asyncio.sleep(0.05)
                continue
            run = claimed.run
            run_id, fence = str(run["id"]), run["fencing_token"]
            record(op="claim", run=run_id, fence=fence, worker=worker, version=run["version"], status=run["status"])
            if fence == 1:
                first_claims += 1
                if args.abandon_every and first_claims % args.abandon_every == 0:
                    record(op="abandon", run=run_id, fence=fence, worker=worker)
                    continue
            lease = LeaseRef(run["id"], worker, fence)
            try:
                version, _ = await store.work.save_checkpoint(lease, CheckpointWrite(
                    expected_version=run["version"], state={"worker": worker, "fence": fence},
                    schema_version=1, step_key=None, event_id=uuid.uuid4(), event_type="agent.checkpoint",
                    event_payload={}))
                record(op="save", run=run_id, fence=fence, worker=worker, version=version)
                await store.work.finish_run(lease, RunFinish(expected_version=version, outcome="COMPLETED", reason="",
                                                             result={"by": worker}, sleep_ms=0,
                                                             pause_when_exhausted=False, error_class="",
                                                             event_id=uuid.uuid4()))
                record(op="done", run=run_id, fence=fence, worker=worker)
            except LeaseLost:
                record(op="lost", run=run_id, fence=fence, worker=worker)

    try:
        await asyncio.gather(*(loop(f"{args.worker}-t{i}") for i in range(args.threads)))
    finally:
        await pool.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("grpc", "store"), required=True)
    parser.add_argument("--addr")
    parser.add_argument("--db-url")
    parser.add_argument("--lease-ms", type=int, default=3000)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--agent", default="demo")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--abandon-every", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stop-file", required=True)
    args = parser.parse_args()
    record = Recorder(Path(args.out))
    try:
        if args.mode == "store":
            asyncio.run(store_main(args, record))
            return 0
        errors: list[BaseException] = []
        threads = [threading.Thread(target=grpc_thread, args=(args, f"{args.worker}-t{i}", record, errors))
                   for i in range(args.threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for error in errors:
            print(f"worker {args.worker} pid {os.getpid()}: {error!r}", file=sys.stderr)
        return 1 if errors else 0
    finally:
        record.close()


if __name__ == "__main__":
    sys.exit(main())
