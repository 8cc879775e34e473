"""The console's browser tests: a real stack (scheduler with API keys, executor, mock tool server,
PostgreSQL), the console serving HTTP on loopback, and Debian's chromium driven by Playwright.

No browser is ever downloaded: Playwright launches /usr/bin/chromium (apt-get install chromium);
the browser tests skip, saying so, only where that executable is missing.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from auth_support import make_key
from executor_support import MockTool, executor, http_tool, mock_tool, scripted_agent, write_agent
from support import Stack, scheduler_stack

from console.app import build_app
from console.config import ConsoleSettings

CHROMIUM = Path(os.environ.get("AGENTRT_TEST_CHROMIUM", "/usr/bin/chromium"))
needs_chromium = pytest.mark.skipif(not CHROMIUM.is_file(),
                                    reason=f"no chromium at {CHROMIUM}: apt-get install -y chromium "
                                           "(.ci/run installs it)")
TENANT = "tenant-a"
WORK_TOKEN = "w-console-tests"
HOUR_MS = 3_600_000


def agent_definitions(mock_url: str) -> list[dict[str, Any]]:
    return [
        scripted_agent("quick", [{"id": "done", "finish": {"n": "${input.n}"}}], []),
        scripted_agent("refunds", [{"id": "refund", "tool": "pay.refund", "args": {"n": "${input.n}"}},
                                   {"id": "done", "finish": "${results.refund.response.id}"}],
                       [http_tool(mock_url, "pay.refund", requires_approval=True)]),
        scripted_agent("legacy", [{"id": "charge", "tool": "pay.legacy", "args": {"n": "${input.n}"}},
                                  {"id": "done", "finish": "${results.charge.response}"}],
                       [http_tool(mock_url, "pay.legacy", lookup=False, timeout_s=0.5)]),
        scripted_agent("slow", [{"id": "nap", "sleep_ms": HOUR_MS}, {"id": "done", "finish": "late"}], []),
        scripted_agent("parent", [{"id": "fan", "spawn": {"join": "all", "detach": False,
                                                          "children": [{"agent": "slow"}, {"agent": "slow"}]},
                                   "timeout_ms": HOUR_MS},
                                  {"id": "done", "finish": {"joined": "${inputs.fan}"}}], []),
        scripted_agent("vault", [{"id": "done", "finish": "stored"}], [],
                       input_schema={"type": "object", "properties": {
                           "card": {"type": "string", "x-agentrt-sensitive": True}, "amount": {"type": "integer"}}}),
    ]


@dataclass
class ConsoleStack:
    stack: Stack
    mock: MockTool
    agents: Path
    url: str
    keys: dict[str, str]  # role -> secret
    db_url: str
    exits: AsyncExitStack

    async def start_executor(self) -> Any:
        return await self.exits.enter_async_context(
            executor(self.stack, self.agents, work_token=WORK_TOKEN, scheduler_insecure=True))

    def admin_metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.keys['admin']}")]


@asynccontextmanager
async def console_server(stack: Stack, **settings: Any) -> AsyncIterator[str]:
    """The console's ASGI app under uvicorn on a free loopback port, in this event loop."""
    values: dict[str, Any] = {"scheduler_addr": stack.addr, "listen_addr": "127.0.0.1:0", "poll_interval_ms": 200,
                              "session_secret": uuid.uuid4().hex}
    app = build_app(ConsoleSettings(**{**values, **settings}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False,
                                           lifespan="off", timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://localhost:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@asynccontextmanager
async def console_stack(db_url: str, tmp_path: Path, console: dict[str, Any] | None = None,
                        **scheduler: Any) -> AsyncIterator[ConsoleStack]:
    async with AsyncExitStack() as exits:
        mock = await exits.enter_async_context(mock_tool(tmp_path))
        settings = {"auth_mode": "api_key", "api_key_cache_ttl_ms": 0, "work_token": WORK_TOKEN, **scheduler}
        stack = await exits.enter_async_context(scheduler_stack(db_url, **settings))
        agents = tmp_path / "agents"
        for definition in agent_definitions(mock.url):
            write_agent(agents, definition)
        keys = {role: (await make_key(db_url, role=role, tenants=[TENANT]))[1]
                for role in ("viewer", "operator", "admin")}
        url = await exits.enter_async_context(console_server(stack, **(console or {})))
        yield ConsoleStack(stack, mock, agents, url, keys, db_url, exits)


@asynccontextmanager
async def browser_page(**context: Any) -> AsyncIterator[Any]:
    """A fresh chromium page (its own cookies). Headless, no sandbox (containers run as root)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                                   args=["--no-sandbox", "--disable-gpu"])
        try:
            ctx = await browser.new_context(**context)
            page = await ctx.new_page()
            page.set_default_timeout(20_000)
            yield page
        finally:
            await browser.close()


async def sign_in(page: Any, url: str, key: str, *, next_path: str = "/runs") -> None:
    await page.goto(f"{url}/signin?next={next_path}")
    await page.get_by_label("API key or token").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(f"{url}{next_path}*")
