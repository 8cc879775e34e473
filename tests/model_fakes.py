"""Loopback fake model providers speaking the real wire formats (no network): OpenAI's Chat Completions
(`POST /v1/chat/completions`) and Responses (`POST /v1/responses`), Anthropic's Messages
(`POST /v1/messages`). Each answer is scripted by the test: a reply body, an `Error` (status, body,
headers such as retry-after), `Raw` text (a 200 that is not JSON), or a function of the request.

Usage is counted, not scripted: prompt tokens are the request's JSON length / 4, so a test or a
benchmark sees the prompt grow or stay flat. Caching is emulated as the providers describe it:
Anthropic reads the longest prefix ending at a cache_control breakpoint that an earlier request wrote;
OpenAI's automatic cache reads the prefix shared with the previous request, in 128-token steps from
1,024 tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Error:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Raw:
    text: str
    status: int = 200
    content_type: str = "text/html"


Answer = dict[str, Any] | Error | Raw
Script = Answer | Callable[[dict[str, Any]], Answer]


def tokens(value: Any) -> int:
    return math.ceil(len(json.dumps(value, sort_keys=True, ensure_ascii=False)) / 4)


# ------------------------------------------------------------------------------------------- bodies


def openai_error(status: int, message: str, *, type_: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> Error:
    return Error(status, {"error": {"message": message, "type": type_, "param": None, "code": code}},
                 headers or {})


def anthropic_error(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> Error:
    return Error(status, {"type": "error", "error": {"type": type_, "message": message},
                          "request_id": "req_fake"}, headers or {})


def chat_tool_calls(*calls: tuple[str, Any]) -> dict[str, Any]:
    """A chat completion proposing the given (name, arguments) calls (arguments as JSON unless text)."""
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": "fake-gpt",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def chat_text(text: str, finish_reason: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": "fake-gpt",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason}]}


def responses_calls(*calls: tuple[str, Any], text: str = "") -> dict[str, Any]:
    output: list[dict[str, Any]] = [
        {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": name,
         "arguments": json.dumps(args), "status": "completed"} for i, (name, args) in enumerate(calls)]
    if text:
        output.append({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]})
    return {"id": "resp_fake", "object": "response", "created_at": 1, "status": "completed", "model": "fake-gpt",
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def anthropic_tool_uses(*calls: tuple[str, Any], text: str = "") -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
                for i, (name, args) in enumerate(calls)]
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude", "content": content,
            "stop_reason": "tool_use", "stop_sequence": None}


def anthropic_text(text: str, stop_reason: str = "end_turn") -> dict[str, Any]:
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude",
            "content": [{"type": "text", "text": text}], "stop_reason": stop_reason, "stop_sequence": None}


# ------------------------------------------------------------------------------------------- the server


class FakeProvider:
    def __init__(self, script: list[Script] | None = None, *, default: Script | None = None) -> None:
        self.script = list(script or [])
        self.default = default  # answers once the script is used up (else a 400 "script exhausted")
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.prompt_tokens: list[int] = []  # per answered request
        self.usages: list[dict[str, Any]] = []  # the usage each answered request reported
        self.times: list[float] = []  # time.monotonic() of each request
        self._written: set[str] = set()  # Anthropic: prefixes written to the cache
        self._previous: list[str] = []  # OpenAI: the previous request's prompt, as parts
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- usage

    def _anthropic_usage(self, body: dict[str, Any]) -> dict[str, int]:
        parts: list[tuple[Any, bool]] = [(t, False) for t in body.get("tools", [])]
        system = body.get("system", [])
        parts += [(b, "cache_control" in b) for b in (system if isinstance(system, list) else [system])]
        for message in body.get("messages", []):
            content = message["content"]
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            parts += [({"role": message["role"], **b}, isinstance(b, dict) and "cache_control" in b) for b in blocks]
        # As Anthropic documents it: the cache is keyed by the content before a block boundary (the
        # markers themselves are not content); a request reads the longest cached prefix ending at any
        # block boundary up to its last breakpoint and writes the prefix at each of its breakpoints.
        total = sum(tokens(p) for p, _ in parts)
        read = last = 0
        fresh = False
        prefix = hashlib.sha256()
        size = 0
        for part, breakpoint in parts:
            content = {k: v for k, v in part.items() if k != "cache_control"} if isinstance(part, dict) else part
            prefix.update(json.dumps(content, sort_keys=True).encode())
            size += tokens(part)
            digest = prefix.hexdigest()
            if digest in self._written:
                read = size
            if breakpoint:
                fresh = digest not in self._written
                self._written.add(digest)
                last = size
        read = min(read, last)
        write = last - read if fresh else 0
        return {"input_tokens": total - read - write, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": write, "output_tokens": 12}

    def _openai_cached(self, parts: list[str]) -> int:
        shared = 0
        for mine, theirs in zip(parts, self._previous, strict=False):
            if mine != theirs:
                break
            shared += math.ceil(len(mine) / 4)
        self._previous = parts
        return shared // 128 * 128 if shared >= 1024 else 0

    def _with_usage(self, path: str, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        if "usage" in reply:
            self.usages.append(reply["usage"])
            return reply
        if path.endswith("/messages"):
            usage = self._anthropic_usage(body)
            prompt = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
            self.prompt_tokens.append(prompt)
            self.usages.append(usage)
            return {**reply, "usage": usage}
        key = "messages" if path.endswith("/chat/completions") else "input"
        parts = [json.dumps(t, sort_keys=True) for t in body.get("tools", [])]
        parts += [json.dumps(body.get("instructions", ""))]
        parts += [json.dumps(m, sort_keys=True) for m in body.get(key, [])]
        prompt = sum(math.ceil(len(p) / 4) for p in parts)
        cached = self._openai_cached(parts)
        self.prompt_tokens.append(prompt)
        if path.endswith("/chat/completions"):
            usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12,
                                     "prompt_tokens_details": {"cached_tokens": cached}}
        else:
            usage = {"input_tokens": prompt, "output_tokens": 12, "total_tokens": prompt + 12,
                     "input_tokens_details": {"cached_tokens": cached},
                     "output_tokens_details": {"reasoning_tokens": 0}}
        self.usages.append(usage)
        return {**reply, "usage": usage}

    # -- serving

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.times.append(time.monotonic())
        self.requests.append(body)
        self.paths.append(request.path)
        self.headers.append(dict(request.headers))
        script = self.script.pop(0) if self.script else self.default
        if script is None:
            return web.json_response({"error": {"message": "script exhausted"}}, status=400)
        answer = script(body) if callable(script) else script
        if isinstance(answer, Error):
            return web.json_response(answer.body, status=answer.status, headers=answer.headers)
        if isinstance(answer, Raw):
            return web.Response(text=answer.text, status=answer.status, content_type=answer.content_type)
        return web.json_response(self._with_usage(request.path, body, answer))

    async def start(self) -> str:
        app = web.Application(client_max_size=64 << 20)
        for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
            app.router.add_post(path, self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    @property
    def openai_url(self) -> str:
        return self.url + "/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeProvider:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
