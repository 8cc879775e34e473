"""GetRunHistory pages (issue 12): every part on its own cursor, bounded pages, tokens bound to the run.

A run with more checkpoints, ledger rows and events than one page holds is
read page by page; the pages together hold every item exactly once, in order,
and the CLI streams them with --all.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from helpers import agentrt
from support import claim, eid, lease_ref, reason_of, rpc_error, scheduler_stack, submit, tool_state

from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration
STEPS = 7  # tool steps: 2 checkpoints, 1 ledger row and 3 events each


async def long_run(stack: Any) -> str:
    """A run of STEPS tool steps (decision, Tx1, Tx2) that completes."""
    run = await submit(stack)
    ref = lease_ref(await claim(stack))
    version = 0
    for n in range(STEPS):
        step, request = f"tool/{n}", {"n": n}
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=version, state_json=json.dumps(tool_state(step, "t", request)),
            schema_version=1, step_key=step, event_id=eid()))
        await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=version + 1, step_key=step, tool_name="t", idempotency_key=f"{run.run_id}/{n}",
            request_json=json.dumps(request), execution_id=eid(), event_id=eid()))
        await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=version + 1, step_key=step, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json=json.dumps({"n": n}), state_json=json.dumps({"cursor": step}), schema_version=1,
            event_id=eid()))
        version += 2
    await stack.work.FinishRun(ws.FinishRunRequest(lease=ref, expected_version=version,
                                                   outcome=ws.FINISH_OUTCOME_COMPLETED, event_id=eid()))
    return run.run_id


async def all_pages(stack: Any, run_id: str, size: int, include: list[int] | None = None) -> list[rs.RunHistory]:
    pages, token = [], ""
    for _ in range(100):
        page = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(
            run_id=run_id, page_size=size, page_token=token, include=include or []), metadata=stack.md())
        pages.append(page)
        token = page.next_page_token
        if not token:
            return pages
    raise AssertionError("no last page")


async def test_pages_hold_every_item_once_in_order(db_url):
    async with scheduler_stack(db_url) as stack:
        run_id = await long_run(stack)
        [whole] = await all_pages(stack, run_id, 500)
        assert (len(whole.checkpoints), len(whole.tool_executions)) == (2 * STEPS, STEPS)
        assert len(whole.events) == 1 + 3 * STEPS + 1
        pages = await all_pages(stack, run_id, 3)
        assert len(pages) == -(-len(whole.events) // 3)  # events are the longest part
        assert all(len(p.checkpoints) <= 3 and len(p.tool_executions) <= 3 and len(p.events) <= 3 for p in pages)
        assert [c.version for p in pages for c in p.checkpoints] == list(range(1, 2 * STEPS + 1))
        assert [t.step_key for p in pages for t in p.tool_executions] == [f"tool/{n}" for n in range(STEPS)]
        assert [e.event_id for p in pages for e in p.events] == [e.event_id for e in whole.events]
        assert pages[-1].next_page_token == "" and all(p.next_page_token for p in pages[:-1])


async def test_include_selects_parts(db_url):
    async with scheduler_stack(db_url) as stack:
        run_id = await long_run(stack)
        pages = await all_pages(stack, run_id, 4, include=[rs.HISTORY_PART_TOOL_EXECUTIONS])
        assert len(pages) == 2
        assert all(not p.checkpoints and not p.events for p in pages)
        assert [t.step_key for p in pages for t in p.tool_executions] == [f"tool/{n}" for n in range(STEPS)]


async def test_a_page_stops_at_its_byte_budget(db_url):
    # 4 x max_payload_bytes per page: with a 4 KB limit, ~2 KB checkpoints fill a 16 KB page after 8.
    async with scheduler_stack(db_url, max_payload_bytes=4096) as stack:
        run = await submit(stack)
        ref = lease_ref(await claim(stack))
        for version in range(12):
            await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
                lease=ref, expected_version=version, state_json=json.dumps({"pad": "x" * 2000}), schema_version=1,
                event_id=eid()))
        pages = await all_pages(stack, run.run_id, 500, include=[rs.HISTORY_PART_CHECKPOINTS])
        sizes = [len(p.checkpoints) for p in pages]
        assert sum(sizes) == 12 and len(pages) >= 2 and max(sizes) < 12, sizes


async def test_bad_page_requests_are_refused(db_url):
    async with scheduler_stack(db_url) as stack:
        run_id = await long_run(stack)
        other = (await submit(stack)).run_id
        [first, *_] = await all_pages(stack, run_id, 2)
        cases = [
            (rs.GetRunHistoryRequest(run_id=run_id, page_size=501), "page_size"),
            (rs.GetRunHistoryRequest(run_id=run_id, page_size=-1), "page_size"),
            (rs.GetRunHistoryRequest(run_id=run_id, page_token="not-a-token"), "page_token"),
            (rs.GetRunHistoryRequest(run_id=other, page_token=first.next_page_token), "page_token"),
            (rs.GetRunHistoryRequest(run_id=run_id, page_token=first.next_page_token,
                                     include=[rs.HISTORY_PART_EVENTS]), "page_token"),
            (rs.GetRunHistoryRequest(run_id=run_id, include=[99]), "include"),
        ]
        for request, field in cases:
            error = await rpc_error(stack.runs.GetRunHistory(request, metadata=stack.md()))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and field in error.details(), error.details()
            assert reason_of(error) is not None


async def test_cli_history_pages_and_streams_all(db_url):
    async with scheduler_stack(db_url) as stack:
        run_id = await long_run(stack)
        code, out, err = await agentrt("runs", "history", run_id, "--page-size", "2", addr=stack.addr)
        assert code == 0, err
        assert "more: agentrt runs history" in out and "--page-token" in out
        code, out, err = await agentrt("runs", "history", run_id, "--page-size", "2", "--all", "--json",
                                       addr=stack.addr)
        assert code == 0, err
        pages = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert len(pages) == -(-(2 + 3 * STEPS) // 2)
        assert [int(c["version"]) for p in pages for c in p["checkpoints"]] == list(range(1, 2 * STEPS + 1))
        assert pages[-1]["next_page_token"] == ""
        code, out, err = await agentrt("runs", "history", run_id, "--page-size", "0", addr=stack.addr)
        assert code != 0 and "--page-size" in err
