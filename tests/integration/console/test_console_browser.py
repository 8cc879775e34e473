"""The console in a real browser (Debian's chromium via Playwright) against a real stack: a scheduler
that takes API keys, an executor, the mock tool server and PostgreSQL, all started here."""

from __future__ import annotations

import base64
import json
import os

import pytest
from auth_support import Issuer, make_key
from console_support import TENANT, browser_page, console_stack, needs_chromium, sign_in
from executor_support import wait_for
from playwright.async_api import expect

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = [pytest.mark.integration, pytest.mark.browser, needs_chromium]


async def submit(cs, agent, payload=None, labels=None):
    reply = await cs.stack.runs.SubmitRun(rs.SubmitRunRequest(
        agent_name=agent, input_json=json.dumps(payload or {}), labels=labels or {}, allow_unregistered=True),
        metadata=cs.admin_metadata())
    return reply.run


async def get(cs, run_id):
    return await cs.stack.runs.GetRun(rs.GetRunRequest(run_id=run_id), metadata=cs.admin_metadata())


async def status_is(cs, run_id, *statuses, within=60.0):
    async def probe():
        run = await get(cs, run_id)
        return run if run.status in statuses else None

    return await wait_for(probe, within, f"run {run_id} in {[pb.RunStatus.Name(s) for s in statuses]}")


async def test_a_wrong_key_is_refused_then_a_run_is_watched_from_queued_to_completed(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        await page.goto(f"{cs.url}/runs")
        assert "/signin" in page.url  # no session: the sign-in page, which comes back to /runs
        await page.get_by_label("API key or token").fill("agrt_not-a-real-key")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("alert")).to_contain_text("Sign-in failed: the scheduler does not accept "
                                                                "this API key")
        assert "/signin" in page.url

        run = await submit(cs, "quick", {"n": 7})
        await sign_in(page, cs.url, cs.keys["operator"], next_path=f"/runs/{run.run_id}")
        await expect(page.locator("#run-status")).to_have_text("QUEUED")
        counts_tab = await page.context.new_page()
        await counts_tab.goto(f"{cs.url}/runs")
        completed = counts_tab.locator('.count[data-status="COMPLETED"]')
        await expect(completed).to_have_text("0")
        # Marks this document: a reload or navigation would lose the mark.
        await page.evaluate("window.__same_document = 'yes'")
        await counts_tab.evaluate("window.__same_document = 'yes'")

        await cs.start_executor()
        await expect(page.locator("#run-status")).to_have_text("COMPLETED", timeout=30_000)
        await expect(page.locator("#live")).to_contain_text('"n": 7')  # the result, in the live part
        await expect(completed).to_have_text("1", timeout=30_000)
        await expect(page.locator("#stale")).to_contain_text("The run is now COMPLETED: reload the page")
        assert await page.evaluate("window.__same_document") == "yes"
        assert await counts_tab.evaluate("window.__same_document") == "yes"


async def test_an_operator_approves_a_run_waiting_for_a_person(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        await cs.start_executor()
        run = await submit(cs, "refunds", {"n": 3})
        await status_is(cs, run.run_id, pb.RUN_STATUS_PAUSED_HUMAN)
        await sign_in(page, cs.url, cs.keys["operator"], next_path="/attention")
        row = page.get_by_role("row").filter(has_text=run.run_id)
        await expect(row).to_contain_text("approval")
        # Keyboard only: into the comment field, type, tab to Approve, press Enter.
        await row.get_by_label(f"Comment for {run.run_id}").focus()
        await page.keyboard.type("refund checked against the order")
        await page.keyboard.press("Tab")
        await expect(row.get_by_role("button", name="Approve")).to_be_focused()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("status")).to_have_text("Approved: the run goes on.")
        done = await status_is(cs, run.run_id, pb.RUN_STATUS_COMPLETED)
        assert json.loads(done.result_json) == "pay.refund-1"  # the mock tool's id: the call was made
        assert len(cs.mock.calls_by_key("pay.refund")) == 1


async def test_an_in_doubt_call_is_settled_with_evidence_and_the_run_goes_on(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        cs.mock.fault("pay.legacy", "error_after", hold_ms=2000)
        await cs.start_executor()
        run = await submit(cs, "legacy", {"n": 4})
        await status_is(cs, run.run_id, pb.RUN_STATUS_PAUSED_INDOUBT)
        await sign_in(page, cs.url, cs.keys["operator"], next_path="/attention")
        form = page.locator("form.resolve").filter(has_text="charge")
        await expect(form).to_contain_text("pay.legacy")
        # Bad input is refused naming the field, and changes nothing: no evidence; a SUCCEEDED without an answer.
        csrf = await form.locator('input[name="csrf"]').get_attribute("value")
        step_key = await form.locator('input[name="step_key"]').get_attribute("value")
        for fields, named in (({"outcome": "NOT_EXECUTED", "evidence": " "}, "evidence: is required"),
                              ({"outcome": "SUCCEEDED", "evidence": "seen"}, "result_json: is required"),
                              ({"outcome": "MAYBE", "evidence": "seen"}, "outcome: must be")):
            reply = await page.request.post(f"{cs.url}/runs/{run.run_id}/resolve", max_redirects=0,
                                            form={"csrf": csrf, "step_key": step_key, **fields})
            assert reply.status == 400 and named in await reply.text(), (fields, reply.status)
        assert (await get(cs, run.run_id)).status == pb.RUN_STATUS_PAUSED_INDOUBT
        reply = await page.request.get(f"{cs.url}/runs/not-a-run-id")
        assert reply.status == 400 and "run_id" in await reply.text()
        # Keyboard only: focus the first choice, move to and pick it, tab through the fields, submit.
        await form.get_by_role("radio", name="It took effect").focus()
        await page.keyboard.press("Space")
        await expect(form.get_by_role("radio", name="It took effect")).to_be_checked()
        await page.keyboard.press("Tab")
        await expect(form.get_by_role("textbox", name="Evidence")).to_be_focused()
        await page.keyboard.type('{"checked": "payments ledger", "charge": "ch_42"}')
        await page.keyboard.press("Tab")
        await page.keyboard.type('{"id": "ch_42", "amount": 4}')
        await form.get_by_role("button", name="Record resolution").focus()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("status")).to_have_text("Resolution recorded: the run goes on.")
        done = await status_is(cs, run.run_id, pb.RUN_STATUS_COMPLETED)
        assert json.loads(done.result_json) == {"id": "ch_42", "amount": 4}
        history = await cs.stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=run.run_id),
                                                    metadata=cs.admin_metadata())
        [row] = history.tool_executions
        evidence = json.loads(row.reconciliation_evidence_json)
        assert evidence["checked"] == "payments ledger" and evidence["resolved_in"] == "console"
        # The audit trail shows who settled it, with the evidence (an admin reads it).
        await page.context.clear_cookies()
        await sign_in(page, cs.url, cs.keys["admin"], next_path=f"/audit?run_id={run.run_id}")
        row = page.get_by_role("row").filter(has_text="charge/attempt-1")
        await expect(row).to_contain_text("payments ledger")
        # The run page shows the ledger's answer on its timeline.
        await page.goto(f"{cs.url}/runs/{run.run_id}")
        await expect(page.locator("#run-status")).to_have_text("COMPLETED")
        await expect(page.locator(".ledger").first).to_have_text("succeeded")


async def test_cancelling_a_parent_cancels_its_children(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        await cs.start_executor()
        run = await submit(cs, "parent")

        async def two_children():
            tree = await cs.stack.runs.GetRunTree(rs.GetRunTreeRequest(run_id=run.run_id),
                                                  metadata=cs.admin_metadata())
            return len(tree.nodes) == 3 or None

        await wait_for(two_children, 30, "the parent's two children")
        await sign_in(page, cs.url, cs.keys["operator"], next_path=f"/runs/{run.run_id}")
        children = page.locator(".tree [data-child]")
        await expect(children).to_have_count(2)
        await page.get_by_label("Reason").fill("no longer needed")
        await page.get_by_role("button", name="Cancel run and children").click()
        await expect(page.get_by_role("status")).to_have_text("Cancel requested.")
        await status_is(cs, run.run_id, pb.RUN_STATUS_CANCELLED)
        await page.reload()
        await expect(page.locator("#run-status")).to_have_text("CANCELLED")
        for child in await children.all():
            await expect(child).to_have_text("CANCELLED")


async def test_a_viewer_sees_no_actions_and_a_forged_post_is_refused_by_the_scheduler(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        await cs.start_executor()
        run = await submit(cs, "refunds", {"n": 5})
        await status_is(cs, run.run_id, pb.RUN_STATUS_PAUSED_HUMAN)
        await sign_in(page, cs.url, cs.keys["viewer"], next_path=f"/runs/{run.run_id}")
        await expect(page.locator("#run-status")).to_have_text("PAUSED_HUMAN")
        await expect(page.locator("#role")).to_have_text("viewer")
        for name in ("Approve", "Reject", "Cancel run and children", "Cancel this run only", "Send signal",
                     "Reveal sealed values"):
            await expect(page.get_by_role("button", name=name)).to_have_count(0)
        await page.goto(f"{cs.url}/attention")
        await expect(page.get_by_role("row").filter(has_text=run.run_id)).to_be_visible()
        await expect(page.get_by_role("button", name="Approve")).to_have_count(0)

        # The viewer forges the operator's form (with the session's own CSRF token): the console passes it
        # on and the scheduler refuses it.
        csrf = await page.locator('input[name="csrf"]').first.get_attribute("value")
        for action, form in (("resume", {"decision": "approve"}), ("cancel", {"reason": "forged"}),
                             ("retry", {"reason": "forged"})):
            reply = await page.request.post(f"{cs.url}/runs/{run.run_id}/{action}", form={"csrf": csrf, **form},
                                            max_redirects=0)
            assert reply.status == 403, (action, reply.status)
            assert "Permission denied: the scheduler refused this" in await reply.text()
        reply = await page.request.post(f"{cs.url}/runs/{run.run_id}/cancel", form={"reason": "no token"},
                                        max_redirects=0)
        assert reply.status == 403 and "CSRF" in await reply.text()
        assert (await get(cs, run.run_id)).status == pb.RUN_STATUS_PAUSED_HUMAN  # nothing changed


async def test_markup_in_a_label_and_an_input_renders_as_text(db_url, tmp_path):
    hostile = "<script>alert('label')</script><img src=x onerror=\"alert('img')\">"
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: dialogs.append(dialog.message))
        run = await submit(cs, "quick", {"n": hostile}, labels={"note": hostile})
        await sign_in(page, cs.url, cs.keys["operator"])
        await expect(page.locator(".label").filter(has_text="<script>")).to_have_text(f"note={hostile}")
        await page.goto(f"{cs.url}/runs/{run.run_id}")
        await expect(page.locator(".labels .label")).to_have_text(f"note={hostile}")
        await expect(page.locator("pre").filter(has_text="onerror")).to_have_count(1)
        assert await page.locator("main script, main img").count() == 0
        assert dialogs == []
        assert TENANT in await page.locator(".meta").inner_text()


async def test_sealed_values_show_redacted_until_an_operator_reveals_them_with_a_reason(db_url, tmp_path):
    card = "4111-SECRET-card-42"
    keyring = json.dumps({"current": "k1", "keys": {"k1": base64.b64encode(os.urandom(32)).decode()}})
    async with console_stack(db_url, tmp_path, encryption_keys=keyring) as cs, browser_page() as page:
        await cs.start_executor()

        async def registered():
            agents = await cs.stack.runs.ListAgents(rs.ListAgentsRequest(), metadata=cs.admin_metadata())
            return any(a.name == "vault" for a in agents.agents)

        await wait_for(registered, 30, "the executor to register its agents")
        run = await submit(cs, "vault", {"card": card, "amount": 12})
        await status_is(cs, run.run_id, pb.RUN_STATUS_COMPLETED)
        await sign_in(page, cs.url, cs.keys["viewer"], next_path=f"/runs/{run.run_id}")
        await expect(page.locator("pre").filter(has_text="amount")).to_contain_text('"card": "[redacted]"')
        await expect(page.get_by_role("button", name="Reveal sealed values")).to_have_count(0)
        assert card not in await page.content()

        await page.context.clear_cookies()
        await sign_in(page, cs.url, cs.keys["operator"], next_path=f"/runs/{run.run_id}")
        assert card not in await page.content()
        await page.get_by_label("Why (recorded in the audit trail)").fill("customer dispute D-7")
        await page.get_by_role("button", name="Reveal sealed values").click()
        await expect(page.locator("pre").filter(has_text="amount")).to_contain_text(f'"card": "{card}"')
        audit = await cs.stack.runs.ListAuditEvents(rs.ListAuditEventsRequest(run_id=run.run_id),
                                                   metadata=cs.admin_metadata())
        assert any("reveal" in e.action and e.reason == "customer dispute D-7" for e in audit.events), \
            [(e.action, e.reason) for e in audit.events]


async def test_an_admin_creates_a_key_seen_once_that_signs_in_until_revoked(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        await sign_in(page, cs.url, cs.keys["admin"], next_path="/keys")
        await page.get_by_label("Name", exact=True).fill("on-call bob")
        await page.get_by_label("Role").select_option("operator")
        await page.get_by_label("Expires after (days; empty = never)").fill("7")
        await page.get_by_role("button", name="Create key").click()
        secret = await page.get_by_label("The key (role operator)").input_value()
        assert secret.startswith("agrt_")
        await page.goto(f"{cs.url}/keys")
        assert secret not in await page.content()  # shown that once only
        row = page.get_by_role("row").filter(has_text="on-call bob")
        await expect(row).to_contain_text("operator")

        other = await page.context.browser.new_context()
        bob = await other.new_page()
        await sign_in(bob, cs.url, secret)
        await expect(bob.locator("#role")).to_have_text("operator")

        await row.get_by_role("button", name="Revoke on-call bob").click()
        await expect(page.get_by_role("status")).to_have_text("Key revoked: it is refused from now on.")
        await bob.goto(f"{cs.url}/runs")  # bob's session holds a key the scheduler now refuses
        await expect(bob.get_by_role("alert")).to_contain_text("no longer accepted")
        await other.close()


async def test_a_schedule_is_created_from_the_form_and_paused(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        await sign_in(page, cs.url, cs.keys["operator"], next_path="/schedules")
        await page.get_by_label("Name", exact=True).fill("nightly-report")
        await page.get_by_label("Agent").fill("quick")
        await page.get_by_label("Input (JSON object)").fill('{"n": 1}')
        await page.get_by_label("Every (seconds)").fill("3600")
        await page.get_by_role("button", name="Create schedule").click()
        await expect(page.get_by_role("status")).to_have_text("Schedule created.")
        row = page.get_by_role("row").filter(has_text="nightly-report")
        await expect(row).to_contain_text("3600000 ms")
        await row.get_by_role("button", name="Pause nightly-report").click()
        await expect(page.get_by_role("status")).to_have_text("Schedule paused.")
        await expect(page.get_by_role("row").filter(has_text="nightly-report")).to_contain_text("paused")
        listed = await cs.stack.runs.ListSchedules(rs.ListSchedulesRequest(), metadata=cs.admin_metadata())
        [schedule] = listed.schedules
        assert schedule.paused and schedule.spec.interval_ms == 3_600_000 and json.loads(
            schedule.spec.input_json) == {"n": 1}


async def test_only_an_admin_of_every_tenant_changes_a_limit(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        # A tenant's admin sees the form, but the scheduler refuses it.
        await sign_in(page, cs.url, cs.keys["admin"], next_path="/queue")
        await page.get_by_label("Limit (tenant:").fill("max_running")
        await page.get_by_label("Value").fill("7")
        await page.get_by_role("button", name="Set limit").click()
        await expect(page.get_by_role("alert")).to_contain_text("Permission denied")

        _, everyone = await make_key(cs.db_url, role="admin", tenants=["*"])
        await page.context.clear_cookies()
        await page.goto(f"{cs.url}/signin?next=/queue")
        await page.get_by_label("API key or token").fill(everyone)
        await page.get_by_label("Tenant (only for").fill(TENANT)
        await page.get_by_role("button", name="Sign in").click()
        await page.get_by_label("Limit (tenant:").fill("max_running")
        await page.get_by_label("Value").fill("7")
        await page.get_by_label("Why (recorded in the audit trail)").fill("incident 12")
        await page.get_by_role("button", name="Set limit").click()
        await expect(page.get_by_role("status")).to_contain_text("Limit set")
        limits = await cs.stack.runs.ListLimits(rs.ListLimitsRequest(), metadata=cs.admin_metadata())
        assert [(limit.scope, limit.tenant_id, limit.name, limit.value) for limit in limits.limits] == [
            ("tenant", TENANT, "max_running", "7")]


async def test_an_oidc_token_signs_in_with_the_role_its_claims_give(db_url, tmp_path):
    issuer = Issuer(tmp_path / "idp")
    async with console_stack(db_url, tmp_path, **{**issuer.settings(), "auth_mode": "api_key,jwt"}) as cs, \
            browser_page() as page:
        token = issuer.token(tenant=TENANT, roles=["operator"], sub="alice")
        await page.goto(f"{cs.url}/signin")
        await page.get_by_label("OIDC bearer token").check()
        await page.get_by_label("API key or token").fill(token)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#role")).to_have_text("operator")
        await expect(page.locator(".who")).to_contain_text("alice")
        expired = issuer.token(tenant=TENANT, roles=["operator"], exp_in_s=-60)
        await page.context.clear_cookies()
        await page.goto(f"{cs.url}/signin")
        await page.get_by_label("OIDC bearer token").check()
        await page.get_by_label("API key or token").fill(expired)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("alert")).to_contain_text("does not accept this token")
        # A token the scheduler takes but a cookie cannot hold is refused at sign-in, saying why.
        huge = issuer.token(tenant=TENANT, roles=["viewer"], sub="s" * 3000)
        await page.get_by_label("OIDC bearer token").check()
        await page.get_by_label("API key or token").fill(huge)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("alert")).to_contain_text("too long to keep in a browser cookie")


async def test_an_admin_of_every_tenant_switches_tenant_and_a_tenant_admin_cannot(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        _, everyone = await make_key(cs.db_url, role="admin", tenants=["*"])
        ours = await submit(cs, "quick", labels={"who": "tenant-a"})
        theirs = (await cs.stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="quick", input_json="{}", labels={"who": "tenant-b"}, allow_unregistered=True),
            metadata=[("authorization", f"Bearer {everyone}"), ("x-tenant-id", "tenant-b")])).run
        await page.goto(f"{cs.url}/signin")
        await page.get_by_label("API key or token").fill(everyone)
        await page.get_by_label("Tenant (only for").fill(TENANT)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator(f'a[href="/runs/{ours.run_id}"]')).to_be_visible()
        await expect(page.locator(f'a[href="/runs/{theirs.run_id}"]')).to_have_count(0)
        await page.get_by_label("Tenant", exact=True).fill("tenant-b")
        await page.get_by_role("button", name="Switch tenant").click()
        await expect(page.locator(f'a[href="/runs/{theirs.run_id}"]')).to_be_visible()
        await expect(page.locator(f'a[href="/runs/{ours.run_id}"]')).to_have_count(0)

        await page.context.clear_cookies()
        await sign_in(page, cs.url, cs.keys["admin"])  # an admin of tenant-a only
        await page.get_by_label("Tenant", exact=True).fill("tenant-b")
        await page.get_by_role("button", name="Switch tenant").click()
        await expect(page.get_by_role("alert")).to_contain_text("Permission denied")
        await page.goto(f"{cs.url}/runs")
        await expect(page.locator(f'a[href="/runs/{ours.run_id}"]')).to_be_visible()
