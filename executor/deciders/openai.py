"""The `openai` decider: OpenAI's Chat Completions (`api: chat`, the default; also any OpenAI-compatible
endpoint such as vLLM or Ollama, by base_url) or Responses API (`api: responses`), through the official
`openai` SDK with its own retries off (executor/deciders/llm_wire.py classifies every failure).

The conversation is laid out tools → system → input → summary → the window of recent steps, so
OpenAI's automatic prefix cache finds the stable part; cached prompt tokens are read from
`prompt_tokens_details.cached_tokens` / `input_tokens_details.cached_tokens` and priced as such.
The Responses API is used statelessly (`store: false`): the run's journal is the conversation.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from executor.agents import AgentDefinition, OpenAIDecider
from executor.config import ModelPrice
from executor.deciders.llm import FINISH, Layout, ModelDecider, parse_arguments
from executor.deciders.llm_wire import NotAReply, Reply, TokenUsage, ToolUse, not_a_reply_when_malformed

__all__ = ["FINISH", "OpenAIDeciderImpl"]
# A keyless OpenAI-compatible endpoint (a local vLLM or Ollama) still needs some key for the SDK.
NO_KEY = "no-key"


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json", exclude_none=True) if hasattr(value, "model_dump") else value


class OpenAIDeciderImpl(ModelDecider):
    system = "openai"

    def __init__(self, agent: AgentDefinition, config: OpenAIDecider, api_key: str | None,
                 prices: dict[str, ModelPrice], tracer: Any = None) -> None:
        super().__init__(agent, config, api_key, prices, tracer)
        self.openai = config
        self.client = openai.AsyncOpenAI(api_key=api_key or NO_KEY, base_url=config.base_url, max_retries=0,
                                         timeout=config.timeout_s)

    async def _chat(self, layout: Layout, *, tools: bool, system: str) -> Reply:
        if self.openai.api == "responses":
            return await self._responses(layout, tools=tools, system=system)
        return await self._completions(layout, tools=tools, system=system)

    # -- Chat Completions

    def messages(self, layout: Layout, system: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": system},
                                     {"role": "user", "content": layout.input_text}]
        out += [{"role": "user", "content": text} for text in layout.preamble()]
        for turn in layout.turns:
            if turn.note:
                out.append({"role": "user", "content": turn.note})
                continue
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args)}}
                for c in turn.calls]})
            out += [{"role": "tool", "tool_call_id": c.id, "content": c.result} for c in turn.calls]
        return out

    async def _completions(self, layout: Layout, *, tools: bool, system: str) -> Reply:
        body: dict[str, Any] = {"model": self.openai.model, "messages": self.messages(layout, system)}
        if tools:
            body["tools"] = [{"type": "function", "function": {"name": n, "description": d, "parameters": p}}
                             for n, d, p in self.functions]
            body["tool_choice"] = "auto"
            body["parallel_tool_calls"] = self.openai.parallel_tool_calls
        if self.openai.temperature is not None:
            body["temperature"] = self.openai.temperature
        if self.openai.max_output_tokens:
            body["max_tokens"] = self.openai.max_output_tokens
        completion = await self.client.chat.completions.create(**body)
        return self.completion_reply(completion)

    @not_a_reply_when_malformed
    def completion_reply(self, completion: Any) -> Reply:
        choices = getattr(completion, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise NotAReply("the answer is not a chat completion")
        choice = choices[0]
        message = choice.message
        calls = [ToolUse(c.function.name, parse_arguments(c.function.arguments), c.function.arguments or "")
                 for c in (message.tool_calls or []) if getattr(c, "function", None) is not None]
        usage = completion.usage
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        details = getattr(usage, "prompt_tokens_details", None)
        return Reply(calls=calls, text=message.content or "", refusal=getattr(message, "refusal", None) or "",
                     filtered=choice.finish_reason == "content_filter", finish_reason=str(choice.finish_reason or ""),
                     model=str(completion.model or self.openai.model), response_id=str(completion.id or ""),
                     usage=TokenUsage(input=prompt, output=int(getattr(usage, "completion_tokens", 0) or 0),
                                      cache_read=int(getattr(details, "cached_tokens", 0) or 0)),
                     raw=_dump(message))

    # -- Responses

    def items(self, layout: Layout) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "user", "content": layout.input_text}]
        out += [{"role": "user", "content": text} for text in layout.preamble()]
        for turn in layout.turns:
            if turn.note:
                out.append({"role": "user", "content": turn.note})
                continue
            out += [{"type": "function_call", "call_id": c.id, "name": c.name, "arguments": json.dumps(c.args)}
                    for c in turn.calls]
            out += [{"type": "function_call_output", "call_id": c.id, "output": c.result} for c in turn.calls]
        return out

    async def _responses(self, layout: Layout, *, tools: bool, system: str) -> Reply:
        body: dict[str, Any] = {"model": self.openai.model, "instructions": system, "input": self.items(layout),
                                "store": False}
        if tools:
            body["tools"] = [{"type": "function", "name": n, "description": d, "parameters": p, "strict": False}
                             for n, d, p in self.functions]
            body["tool_choice"] = "auto"
            body["parallel_tool_calls"] = self.openai.parallel_tool_calls
        if self.openai.temperature is not None:
            body["temperature"] = self.openai.temperature
        if self.openai.max_output_tokens:
            body["max_output_tokens"] = self.openai.max_output_tokens
        response = await self.client.responses.create(**body)
        return self.response_reply(response)

    @not_a_reply_when_malformed
    def response_reply(self, response: Any) -> Reply:
        output = getattr(response, "output", None)
        if output is None:
            raise NotAReply("the answer is not a response")
        calls, texts, refusals = [], [], []
        for item in output:
            kind = getattr(item, "type", "")
            if kind == "function_call":
                calls.append(ToolUse(item.name, parse_arguments(item.arguments), item.arguments or ""))
            elif kind == "message":
                for part in getattr(item, "content", None) or []:
                    if getattr(part, "type", "") == "output_text":
                        texts.append(part.text)
                    elif getattr(part, "type", "") == "refusal":
                        refusals.append(part.refusal)
        incomplete = getattr(getattr(response, "incomplete_details", None), "reason", None) or ""
        usage = response.usage
        details = getattr(usage, "input_tokens_details", None)
        return Reply(calls=calls, text="".join(texts), refusal=" ".join(refusals),
                     filtered=incomplete == "content_filter",
                     finish_reason=incomplete or str(getattr(response, "status", "") or ""),
                     model=str(response.model or self.openai.model), response_id=str(response.id or ""),
                     usage=TokenUsage(input=int(getattr(usage, "input_tokens", 0) or 0),
                                      output=int(getattr(usage, "output_tokens", 0) or 0),
                                      cache_read=int(getattr(details, "cached_tokens", 0) or 0)),
                     raw={"output": [_dump(item) for item in output]})

    async def close(self) -> None:
        await self.client.close()
