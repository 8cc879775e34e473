"""Every console page passes axe-core (the axe-playwright-python package's copy) in Debian's chromium
with no serious or critical violation, with the page holding what it holds in use: approvals, an
in-doubt call and its resolve form, a finished run's timeline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from axe_playwright_python.async_playwright import Axe
from console_support import browser_page, console_stack, needs_chromium, sign_in
from executor_support import wait_for

from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs

pytestmark = [pytest.mark.integration, pytest.mark.browser, needs_chromium]

# AGENTRT_CONSOLE_SCREENSHOTS=docs/console-screenshots: the docs' screenshots, taken from this test's pages.
SCREENSHOTS = os.environ.get("AGENTRT_CONSOLE_SCREENSHOTS")
SHOTS = {"/runs": "runs", "/attention": "attention", "/queue": "queue"}


async def test_every_page_has_no_serious_or_critical_accessibility_violation(db_url, tmp_path):
    async with console_stack(db_url, tmp_path) as cs, browser_page() as page:
        cs.mock.fault("pay.legacy", "error_after", hold_ms=2000)
        await cs.start_executor()
        runs = {}
        for agent in ("quick", "refunds", "legacy"):
            reply = await cs.stack.runs.SubmitRun(rs.SubmitRunRequest(
                agent_name=agent, input_json=json.dumps({"n": 1}), labels={"team": "ops"}),
                metadata=cs.admin_metadata())
            runs[agent] = reply.run.run_id
        wanted = {"quick": pb.RUN_STATUS_COMPLETED, "refunds": pb.RUN_STATUS_PAUSED_HUMAN,
                  "legacy": pb.RUN_STATUS_PAUSED_INDOUBT}

        async def settled():
            for agent, status in wanted.items():
                run = await cs.stack.runs.GetRun(rs.GetRunRequest(run_id=runs[agent]), metadata=cs.admin_metadata())
                if run.status != status:
                    return None
            return True

        await wait_for(settled, 60, "the three runs to settle")
        axe = Axe()
        # The strict CSP breaks nothing the pages use: the browser reports no violation and no script error.
        problems_seen: list[str] = []
        page.on("console", lambda message: problems_seen.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: problems_seen.append(str(error)))
        # The check can fail: a page with an unlabelled image and field is caught.
        await page.set_content('<html><body><img src="data:,"><input type="text"></body></html>')
        control = {v["id"] for v in (await axe.run(page)).response["violations"]}
        assert {"image-alt", "label"} <= control, control
        # And a CSP violation is seen: an inline script under a policy that forbids it.
        await page.set_content("<html><head><meta http-equiv=\"Content-Security-Policy\" content=\"script-src 'self'\">"
                               "</head><body><script>document.title = 'ran'</script></body></html>")
        assert any("Content Security Policy" in text for text in problems_seen), problems_seen
        assert await page.title() != "ran"
        problems_seen.clear()
        await page.goto(f"{cs.url}/signin")
        pages = {"/signin": await axe.run(page)}
        await sign_in(page, cs.url, cs.keys["admin"])
        for path in ("/runs", f"/runs/{runs['quick']}", f"/runs/{runs['refunds']}", f"/runs/{runs['legacy']}",
                     "/attention", "/queue", "/agents", "/schedules", "/audit", "/keys"):
            await page.goto(f"{cs.url}{path}")
            pages[path] = await axe.run(page)
            name = SHOTS.get(path) or ("run-in-doubt" if path == f"/runs/{runs['legacy']}" else None)
            if SCREENSHOTS and name:
                await page.set_viewport_size({"width": 1280, "height": 900})
                await page.screenshot(path=Path(SCREENSHOTS) / f"{name}.png", full_page=False)
        problems = {path: [(v["id"], v["impact"], v["help"], [n["target"] for n in v["nodes"]][:3])
                           for v in result.response["violations"] if v["impact"] in ("serious", "critical")]
                    for path, result in pages.items()}
        assert not any(problems.values()), problems
        assert not [text for text in problems_seen if "Content Security Policy" in text or "htmx" in text.lower()
                    or "Uncaught" in text], problems_seen
        assert all(result.response["testEngine"]["name"] == "axe-core" for result in pages.values())
