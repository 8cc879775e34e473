"""A local server speaking the OpenAI chat-completions protocol, scripted by the test (no network)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

Reply = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def tool_call(name: str, arguments: Any, *, call_id: str = "call_1", raw: bool = False, tokens: int = 30,
              ) -> dict[str, Any]:
    """A completion proposing one tool call (arguments as JSON text unless raw=True passes text through)."""
    text = arguments if raw else json.dumps(arguments)
    message = {"role": "assistant", "content": None,
               "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}]}
    return completion(message, "tool_calls", tokens)


def completion(message: dict[str, Any], finish_reason: str = "stop", tokens: int = 30) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "stub-model-1",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": tokens - 10, "completion_tokens": 10, "total_tokens": tokens}}


class OpenAIStub:
    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.status_codes: list[int] = []  # e.g. [503] to fail the next call once
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.status_codes:
            return web.json_response({"error": {"message": "unavailable"}}, status=self.status_codes.pop(0))
        if not self.replies:
            return web.json_response({"error": {"message": "script exhausted"}}, status=400)
        reply = self.replies.pop(0)
        return web.json_response(reply(body) if callable(reply) else reply)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> OpenAIStub:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
