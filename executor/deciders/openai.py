"""The `openai` decider: any OpenAI-compatible chat-completions endpoint with tool calling.

The conversation is rebuilt from the checkpoint every time (input, each
decided step and its result, each unusable reply), so a recovered run never
depends on memory. A parse failure, refusal or content filter comes back as
`Invalid` and is recorded in the checkpoint by the executor; token usage and
cost are reported with every proposal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from executor.agents import AgentDefinition, OpenAIDecider
from executor.checkpoint import State
from executor.deciders.base import (
    DeciderUnavailable,
    Decision,
    DecisionContext,
    Finish,
    Invalid,
    Proposal,
    Sleep,
    ToolCall,
    WaitForInput,
)
from shared.tracing import AGENT

_TRACER = trace.get_tracer("agentrt.decider.openai")
# The model cost of the call, priced by the decider's usd_per_1k_* settings (no GenAI convention names it).
COST_ATTRIBUTE = "agentrt.cost_usd"
FINISH, SLEEP, WAIT = "agentrt_finish", "agentrt_sleep", "agentrt_wait_for_input"
DEFAULT_SYSTEM = ("You are an agent. Use the tools to do the task in the user's message. "
                  f"Call {FINISH} with the result when the task is done.")
_BUILTINS: dict[str, dict[str, Any]] = {
    FINISH: {"description": "End the task with its result.",
             "parameters": {"type": "object", "properties": {"result": {}}, "required": ["result"]}},
    SLEEP: {"description": "Wait durably before the next step.",
            "parameters": {"type": "object", "properties": {"seconds": {"type": "number", "exclusiveMinimum": 0}},
                           "required": ["seconds"]}},
    WAIT: {"description": "Ask a person for input and wait for the answer.",
           "parameters": {"type": "object", "properties": {"prompt": {"type": "string"}},
                          "required": ["prompt"]}},
}


def api_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]


def call_id(step_key: str) -> str:
    return "call_" + hashlib.sha256(step_key.encode()).hexdigest()[:24]


def capped(text: str, limit: int) -> str:
    """At most `limit` characters, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"… [cut {len(text) - limit} of {len(text)} characters]"


def _usage_attributes(proposal: Proposal) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.response.model": proposal.model, "gen_ai.usage.input_tokens": proposal.input_tokens,
        "gen_ai.usage.output_tokens": proposal.output_tokens, COST_ATTRIBUTE: proposal.cost_usd,
        "agentrt.decision": type(proposal.decision).__name__}
    if proposal.extra.get("finish_reason"):
        attributes["gen_ai.response.finish_reasons"] = (proposal.extra["finish_reason"],)
    if proposal.extra.get("response_id"):
        attributes["gen_ai.response.id"] = proposal.extra["response_id"]
    return attributes


class OpenAIDeciderImpl:
    pure = False

    def __init__(self, agent: AgentDefinition, config: OpenAIDecider, session: aiohttp.ClientSession,
                 default_api_key: str | None, tracer: Any = None) -> None:
        self.agent = agent
        self.tracer = tracer or _TRACER
        self.config = config
        self.session = session
        self.api_key = (os.environ.get(config.api_key_env) if config.api_key_env else None) or default_api_key
        self.names = {api_name(t.name): t.name for t in agent.tools}
        if len(self.names) != len(agent.tools) or set(self.names) & set(_BUILTINS):
            raise ValueError(f"agent {agent.name}: tool names collide once made OpenAI-safe")
        builtins = [FINISH] + ([SLEEP] if config.allow_sleep else []) + ([WAIT] if config.allow_wait_for_input else [])
        self.tools = [{"type": "function", "function": {"name": api_name(t.name), "description": t.description,
                                                        "parameters": t.input_schema}} for t in agent.tools]
        self.tools += [{"type": "function", "function": {"name": name, **_BUILTINS[name]}} for name in builtins]

    def messages(self, ctx: DecisionContext) -> list[dict[str, Any]]:
        state: State = ctx.state
        out: list[dict[str, Any]] = [
            {"role": "system", "content": self.agent.prompt.system or DEFAULT_SYSTEM},
            {"role": "user", "content": json.dumps(ctx.input, sort_keys=True)},
        ]
        policy = self.config.context
        turns = [e for e in state.history[-4 * policy.last_turns:] if e.kind not in ("finish", "fail")]
        kept = turns[-policy.last_turns:]
        if len(kept) < len(state.history):
            earlier = sum(1 for e in state.history if e.kind not in ("finish", "fail")) - len(kept)
            if earlier > 0:
                out.append({"role": "user", "content": f"({earlier} earlier steps of this run are not shown.)"})
        for entry in kept:
            if entry.kind == "exception":
                out.append({"role": "user", "content": f"Your previous reply could not be used "
                            f"({entry.detail.get('kind')}: {entry.detail.get('detail')}). Reply again."})
                continue
            if entry.kind in ("finish", "fail"):
                continue
            name, args, result = self._replay(entry.kind, entry.tool, entry.detail, entry.step_key, state)
            cid = call_id(entry.step_key)
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
            out.append({"role": "tool", "tool_call_id": cid,
                        "content": capped(json.dumps(result, sort_keys=True), policy.max_tool_answer_chars)})
        return out

    @staticmethod
    def _replay(kind: str, tool: str | None, detail: dict[str, Any], step_key: str, state: State,
                ) -> tuple[str, dict[str, Any], Any]:
        if kind == "sleep":
            return SLEEP, {"seconds": (detail.get("sleep_ms") or 0) / 1000}, {"slept": True}
        if kind == "input":
            return WAIT, {"prompt": detail.get("prompt", "")}, {"input": state.inputs.get(step_key)}
        result = state.tool_results.get(step_key) or {"status": "PENDING"}
        shown = {k: result.get(k) for k in ("status", "response", "error_code", "detail", "comment") if k in result}
        return api_name(tool or ""), detail.get("args", {}), shown

    async def decide(self, ctx: DecisionContext) -> Proposal:
        body: dict[str, Any] = {"model": self.config.model, "messages": self.messages(ctx), "tools": self.tools,
                                "tool_choice": "auto", "parallel_tool_calls": False,
                                "temperature": self.config.temperature}
        if self.config.max_output_tokens:
            body["max_tokens"] = self.config.max_output_tokens
        url = self.config.base_url.rstrip("/") + "/chat/completions"
        with self.tracer.start_as_current_span(f"chat {self.config.model}", kind=SpanKind.CLIENT,
                                           attributes=self._request_attributes(url, body),
                                           record_exception=False, set_status_on_exception=False) as span:
            try:
                proposal = await self._complete(ctx, url, body)
            except DeciderUnavailable as exc:
                span.set_attribute("error.type", "unavailable")
                span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
                raise
            if span.is_recording():
                span.set_attributes(_usage_attributes(proposal))
            return proposal

    def _request_attributes(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """GenAI semantic conventions for the request (no prompt or answer text: payloads stay out of traces)."""
        parts = urlsplit(url)
        attributes: dict[str, Any] = {
            "gen_ai.system": "openai", "gen_ai.operation.name": "chat", "gen_ai.request.model": self.config.model,
            "gen_ai.request.temperature": float(self.config.temperature), "server.address": parts.hostname or "",
            "server.port": parts.port or (443 if parts.scheme == "https" else 80), AGENT: self.agent.name}
        if self.config.max_output_tokens:
            attributes["gen_ai.request.max_tokens"] = int(body["max_tokens"])
        return attributes

    async def _complete(self, ctx: DecisionContext, url: str, body: dict[str, Any]) -> Proposal:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with self.session.post(url, json=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=self.config.timeout_s)) as resp:
                status, text = resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise DeciderUnavailable(f"{url}: {type(exc).__name__}: {exc}") from None
        if status == 429 or status >= 500 or status == 408:
            raise DeciderUnavailable(f"{url}: HTTP {status}: {text[:300]}")
        index = ctx.state.step_index
        if status != 200:
            return Proposal(Invalid("parse_failure", f"HTTP {status}: {text[:500]}"), f"model@{index}",
                            raw=text[:2000], model=self.config.model)
        try:
            reply = json.loads(text)
            choice = reply["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            return Proposal(Invalid("parse_failure", "response is not a chat completion"), f"model@{index}",
                            raw=text[:2000], model=self.config.model)
        usage = reply.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        tokens = int(usage.get("total_tokens") or prompt_tokens + completion_tokens)
        cost = (prompt_tokens * self.config.usd_per_1k_input_tokens
                + completion_tokens * self.config.usd_per_1k_output_tokens) / 1000
        decision, node = self._decision(choice, message, index)
        return Proposal(decision, node, raw=message, tokens=tokens, cost_usd=cost,
                        model=str(reply.get("model") or self.config.model), input_tokens=prompt_tokens,
                        output_tokens=completion_tokens,
                        extra={"finish_reason": str(choice.get("finish_reason") or ""),
                               "response_id": str(reply.get("id") or "")})

    def _decision(self, choice: dict[str, Any], message: dict[str, Any], index: int) -> tuple[Decision, str]:
        if choice.get("finish_reason") == "content_filter":
            return Invalid("content_filter", "the reply was withheld by the content filter"), f"model@{index}"
        if message.get("refusal"):
            return Invalid("refusal", str(message["refusal"])[:1000]), f"model@{index}"
        calls = message.get("tool_calls") or []
        if not calls:
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                return Finish({"answer": content}), "finish"
            return Invalid("empty", "neither a tool call nor content"), f"model@{index}"
        function = calls[0].get("function") or {}
        name = str(function.get("name") or "")
        try:
            args = json.loads(function.get("arguments") or "{}")
        except ValueError as exc:
            return Invalid("parse_failure", f"arguments of {name} are not JSON: {exc}"), f"model@{index}"
        if not isinstance(args, dict):
            return Invalid("parse_failure", f"arguments of {name} are not a JSON object"), f"model@{index}"
        if name == FINISH:
            return Finish(args.get("result")), "finish"
        if name == SLEEP:
            seconds = args.get("seconds")
            if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
                return Invalid("invalid_arguments", f"{SLEEP}: seconds must be a positive number"), f"model@{index}"
            return Sleep(max(1, int(seconds * 1000))), f"sleep@{index}"
        if name == WAIT:
            return WaitForInput(str(args.get("prompt") or "")), f"input@{index}"
        if name not in self.names:
            return Invalid("unknown_tool", f"no tool named {name!r}"), f"model@{index}"
        tool = self.names[name]
        return ToolCall(tool, args), f"{tool}@{index}"

    async def close(self) -> None:
        return None
