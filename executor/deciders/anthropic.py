"""The `anthropic` decider: Anthropic's Messages API through the official `anthropic` SDK, its own retries
off (executor/deciders/llm_wire.py classifies every failure: 429 with retry-after, 529 overloaded...).

Prompt caching: with `prompt_caching` (the default) the request carries three cache_control
breakpoints: on the system block (caching the tool definitions and the system prompt), on the first
user message (the run's input and the running summary: the stable prefix) and on the last block of
the conversation, so each call reads what the previous one wrote. The cache's reads and writes come
back as cache_read_input_tokens / cache_creation_input_tokens and are priced as such.
"""

from __future__ import annotations

from typing import Any

import anthropic

from executor.agents import AgentDefinition, AnthropicDecider
from executor.config import ModelPrice
from executor.deciders.llm import Layout, ModelDecider
from executor.deciders.llm_wire import NotAReply, Reply, TokenUsage, ToolUse, not_a_reply_when_malformed

EPHEMERAL = {"type": "ephemeral"}


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json", exclude_none=True) if hasattr(value, "model_dump") else value


class AnthropicDeciderImpl(ModelDecider):
    system = "anthropic"

    def __init__(self, agent: AgentDefinition, config: AnthropicDecider, api_key: str | None,
                 prices: dict[str, ModelPrice], tracer: Any = None) -> None:
        super().__init__(agent, config, api_key, prices, tracer)
        self.anthropic = config
        self.client = anthropic.AsyncAnthropic(api_key=api_key, base_url=config.base_url, max_retries=0,
                                               timeout=config.timeout_s)

    def messages(self, layout: Layout) -> list[dict[str, Any]]:
        """User and assistant alternate: notes join the user message before them."""
        first: list[dict[str, Any]] = [{"type": "text", "text": layout.input_text}]
        first += [{"type": "text", "text": text} for text in layout.preamble()]
        if self.anthropic.prompt_caching:
            first[-1] = {**first[-1], "cache_control": EPHEMERAL}
        out: list[dict[str, Any]] = [{"role": "user", "content": first}]
        for turn in layout.turns:
            if turn.note:
                if out[-1]["role"] == "user":
                    out[-1] = {"role": "user", "content": [*out[-1]["content"], {"type": "text", "text": turn.note}]}
                else:
                    out.append({"role": "user", "content": [{"type": "text", "text": turn.note}]})
                continue
            out.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in turn.calls]})
            out.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c.id, "content": c.result} for c in turn.calls]})
        if self.anthropic.prompt_caching and len(out) > 1:
            last = out[-1]["content"]
            out[-1] = {**out[-1], "content": [*last[:-1], {**last[-1], "cache_control": EPHEMERAL}]}
        return out

    async def _chat(self, layout: Layout, *, tools: bool, system: str) -> Reply:
        system_block: dict[str, Any] = {"type": "text", "text": system}
        if self.anthropic.prompt_caching:
            system_block["cache_control"] = EPHEMERAL
        body: dict[str, Any] = {"model": self.anthropic.model, "max_tokens": self.anthropic.max_output_tokens or 4096,
                                "system": [system_block], "messages": self.messages(layout)}
        if tools:
            body["tools"] = [{"name": n, "description": d, "input_schema": p} for n, d, p in self.functions]
            body["tool_choice"] = {"type": "auto",
                                   "disable_parallel_tool_use": not self.anthropic.parallel_tool_calls}
        if self.anthropic.temperature is not None:  # not a parameter of this SDK's create(): sent as it is
            body["extra_body"] = {"temperature": self.anthropic.temperature}
        message = await self.client.messages.create(**body)
        return self.reply(message)

    @not_a_reply_when_malformed
    def reply(self, message: Any) -> Reply:
        content = getattr(message, "content", None)
        if content is None:
            raise NotAReply("the answer is not a message")
        calls, texts = [], []
        for block in content:
            kind = getattr(block, "type", "")
            if kind == "tool_use":
                arguments = block.input if isinstance(block.input, dict) else None
                calls.append(ToolUse(block.name, arguments, "" if arguments is not None else str(block.input)))
            elif kind == "text":
                texts.append(block.text)
        usage = message.usage
        fresh = int(getattr(usage, "input_tokens", 0) or 0)
        read = int(getattr(usage, "cache_read_input_tokens", 0) or 0)
        written = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
        stop = str(getattr(message, "stop_reason", "") or "")
        text = "".join(texts)
        return Reply(calls=calls, text=text, refusal=(text or "the model refused") if stop == "refusal" else "",
                     finish_reason=stop, model=str(message.model or self.anthropic.model),
                     response_id=str(message.id or ""),
                     usage=TokenUsage(input=fresh + read + written, output=int(getattr(usage, "output_tokens", 0) or 0),
                                      cache_read=read, cache_write=written),
                     raw={"content": [_dump(b) for b in content], "stop_reason": stop})

    async def close(self) -> None:
        await self.client.close()
