"""The runs page's server-side filters and their pages, retrying a failed run and cancelling a parent
while keeping its children, in a real browser (Debian's chromium via Playwright) against a real stack."""

from __future__ import annotations

import json

import pytest
from console_support import WORK_TOKEN, browser_page, console_stack, needs_chromium, sign_in
from executor_support import wait_for
from playwright.async_api import expect
from support import eid, lease_ref

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = [pytest.mark.integration, pytest.mark.browser, needs_chromium]


async def submit(cs, agent, payload=None, labels=None, priority=0):
    reply = await cs.stack.runs.SubmitRun(rs.SubmitRunRequest(
        agent_name=agent, input_json=json.dumps(payload or {}), labels=labels or {}, priority=priority,
        allow_unregistered=True), metadata=cs.admin_metadata())
    return reply.run


async def get(cs, run_id):
    return await cs.stack.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=cs.admin_metadata())


async def shown_run_ids(page) -> list[str]:
    return [await cell.inner_text() for cell in await page.locator("table.runs tbody td a code").all()]


async def test_runs_are_filtered_by_label_and_priority_and_paged_with_their_filters(db_url, tmp_path):
    async with console_stack(db_url, tmp_path, console={"page_size": 2}) as cs, browser_page() as page:
        wanted = [(await submit(cs, "quick", {"n": i}, {"team": "a"}, priority=7)).run_id for i in range(5)]
        await submit(cs, "quick", {"n": 9}, {"team": "a"}, priority=2)  # below the range
        await submit(cs, "quick", {"n": 9}, {"team": "b"}, priority=8)  # another team
        await sign_in(page, cs.url, cs.keys["operator"])
        await page.get_by_label("Labels").fill("team=a")
        await page.get_by_label("At least").fill("5")
        await page.get_by_role("button", name="Filter").click()
        await page.wait_for_url("**min_priority=5**")
        seen: list[str] = []
        for _ in range(4):
            seen += await shown_run_ids(page)
            older = page.get_by_role("link", name="Older runs")
            if await older.count() == 0:
                break
            target = await older.get_attribute("href")
            assert target is not None and "label=team%3Da" in target and "min_priority=5" in target
            await older.click()
            await page.wait_for_url("**page_token=**")
        assert seen == list(reversed(wanted))  # newest first, each once, across three pages of two
        await expect(page.get_by_label("Labels")).to_have_value("team=a")  # the form keeps its filters
        # The scheduler refuses a range upside down; the page says so beside the form.
        await page.goto(f"{cs.url}/runs?min_priority=6&max_priority=2")
        await expect(page.get_by_role("alert")).to_contain_text("min_priority: must not be above max_priority")
        await page.goto(f"{cs.url}/runs?label=team")
        await expect(page.get_by_role("alert")).to_contain_text("label: 'team' is not key=value")


async def test_a_failed_run_is_retried_and_a_parent_is_cancelled_keeping_its_children(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        failed = await submit(cs, "flaky", {"n": 1}, {"team": "a"}, priority=6)
        work = [("authorization", f"Bearer {WORK_TOKEN}")]
        claimed = await cs.stack.work.ClaimWork(ws.ClaimWorkRequest(worker_id="w-test", agents=["flaky"]),
                                                metadata=work)
        await cs.stack.work.FinishRun(ws.FinishRunRequest(
            lease=lease_ref(claimed.lease), expected_version=0, outcome=ws.FINISH_OUTCOME_FAILED,
            reason="card declined", event_id=eid()), metadata=work)
        await sign_in(page, cs.url, cs.keys["operator"], next_path=f"/runs/{failed.run_id}")
        await expect(page.locator("#run-status")).to_have_text("FAILED")
        await page.get_by_label("Reason (recorded in the audit trail)").fill("card updated")
        await page.get_by_role("button", name="Retry as a new run").click()
        await expect(page.get_by_role("status")).to_have_text("Retried: this is the new run.")
        new_id = page.url.split("/runs/")[1].split("?")[0]
        assert new_id != failed.run_id
        await expect(page.locator(".meta")).to_contain_text(f"retry of {failed.run_id}")
        new = await get(cs, new_id)
        assert (new.retry_of_run_id, json.loads(new.input_json), dict(new.labels), new.priority) == (
            failed.run_id, {"n": 1}, {"team": "a"}, 6)
        await expect(page.get_by_role("button", name="Retry as a new run")).to_have_count(0)  # QUEUED: no retry

        await cs.start_executor()
        parent = await submit(cs, "parent")

        async def two_children():
            tree = await cs.stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=parent.run_id),
                                                  metadata=cs.admin_metadata())
            return [n.run.run_id for n in tree.nodes[1:]] if len(tree.nodes) == 3 else None

        children = await wait_for(two_children, 30, "the parent's two children")
        await page.goto(f"{cs.url}/runs/{parent.run_id}")
        await expect(page.locator(".tree [data-child]")).to_have_count(2)
        await page.get_by_label("Reason", exact=True).fill("the parent alone")
        await page.get_by_role("button", name="Cancel this run only").click()
        await expect(page.get_by_role("status")).to_have_text(
            "Cancel requested for this run alone: its children go on.")

        async def parent_cancelled():
            return (await get(cs, parent.run_id)).status == pb.RUN_STATUS_CANCELLED or None

        await wait_for(parent_cancelled, 30, "the parent CANCELLED")
        assert [(await get(cs, c)).status != pb.RUN_STATUS_CANCELLED for c in children] == [True, True]
        await page.reload()
        await expect(page.locator("#run-status")).to_have_text("CANCELLED")
        for child in await page.locator(".tree [data-child]").all():
            await expect(child).not_to_have_text("CANCELLED")
