"""What the model deciders (`openai`, `anthropic`) share: one error table, the conversation laid out from
the run's history under the agent's context policy, parallel tool calls as steps, usage and prices,
and the GenAI spans.

A decider only proposes (docs/design.md §invariants, rule 6). The conversation is rebuilt from the
checkpoint and journal on every call, so a recovered run never depends on memory. What the decider
keeps between calls lives in the run's `agent_state` (persisted with the decision it came with):
the tool calls of a reply not yet turned into steps (`queue`) and the running summary of the steps
before the context window (`summary`, `summary_through`). docs/models.md describes all of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import jsonschema
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from executor.agents import AgentDefinition, ContextPolicy, ModelDeciderBase
from executor.checkpoint import HistoryEntry, State
from executor.config import ModelPrice
from executor.deciders.llm_wire import Classified, Reply, TokenUsage, Verdict, classify, price_of
from executor.decisions import (
    DeciderRateLimited,
    DeciderUnavailable,
    Decision,
    DecisionContext,
    Fail,
    Finish,
    Invalid,
    InvalidKind,
    Proposal,
    Sleep,
    ToolCall,
    WaitForInput,
)
from shared.tracing import AGENT

log = logging.getLogger(__name__)
_TRACER = trace.get_tracer("agentrt.decider")
# The model cost of the call, priced from the price table (no GenAI convention names it).
COST_ATTRIBUTE = "agentrt.cost_usd"
FINISH, SLEEP, WAIT = "agentrt_finish", "agentrt_sleep", "agentrt_wait_for_input"
DEFAULT_SYSTEM = ("You are an agent. Use the tools to do the task in the user's message. "
                  f"Call {FINISH} with the result when the task is done.")
SUMMARY_SYSTEM = ("You keep the running notes of an agent's long task. Merge the previous notes with the steps "
                  "below into new notes: what was done, what was learned (ids, values, decisions), what is "
                  "still open. Plain text, no preamble, at most {chars} characters.")
MAX_SHRINKS = 2  # a context-too-long answer is retried with a window a quarter, then a sixteenth the size
_MEMO_LIMIT = 1000


def builtin_tools(config: ModelDeciderBase) -> dict[str, dict[str, Any]]:
    """The decisions that are not tools, offered as functions: finish (with the result's schema), sleep, wait."""
    result_schema: dict[str, Any] = config.result_schema if config.result_schema is not None else {}
    tools = {FINISH: {"description": "End the task with its result.",
                      "parameters": {"type": "object", "properties": {"result": result_schema},
                                     "required": ["result"]}}}
    if config.allow_sleep:
        tools[SLEEP] = {"description": "Wait durably before the next step.",
                        "parameters": {"type": "object",
                                       "properties": {"seconds": {"type": "number", "exclusiveMinimum": 0}},
                                       "required": ["seconds"]}}
    if config.allow_wait_for_input:
        tools[WAIT] = {"description": "Ask a person for input and wait for the answer.",
                       "parameters": {"type": "object", "properties": {"prompt": {"type": "string"}},
                                      "required": ["prompt"]}}
    return tools


def api_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]


def call_id(step_key: str) -> str:
    """The id a replayed call carries: derived from its step key, so every rebuild is the same text."""
    return "call_" + hashlib.sha256(step_key.encode()).hexdigest()[:24]


def capped(text: str, limit: int, pointer: str = "") -> str:
    """At most `limit` characters, with a marker saying how much was cut and where the rest is."""
    if len(text) <= limit:
        return text
    where = f"; the full answer is step {pointer} of this run's ledger" if pointer else ""
    return text[:limit] + f"… [cut {len(text) - limit} of {len(text)} characters{where}]"


# ---------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Call:
    """A decided step replayed as the tool call that proposed it, with its result as text."""

    id: str
    name: str
    args: dict[str, Any]
    result: str


@dataclass(frozen=True)
class Turn:
    """One model reply's calls, or a note to the model (an unusable reply, say)."""

    calls: tuple[Call, ...] = ()
    note: str = ""


@dataclass
class Layout:
    """What goes to the model: the input, the running summary, a count of unshown steps, the window."""

    input_text: str
    summary: str = ""
    omitted: int = 0
    turns: list[Turn] = field(default_factory=list)

    def preamble(self) -> list[str]:
        """The stable prefix's user texts after the input (the summary, or what is not shown)."""
        out = []
        if self.summary:
            out.append(f"Notes on the earlier steps of this run (summarised):\n{self.summary}")
        if self.omitted:
            out.append(f"({self.omitted} earlier steps of this run are not shown.)")
        return out


def turn_of(entry: HistoryEntry) -> int:
    """The model call an entry came from: `<name>@<turn>` or `<name>@<turn>.<k>` (the k-th call of it)."""
    _, _, suffix = entry.node.rpartition("@")
    head = suffix.split(".", 1)[0]
    return int(head) if head.isdigit() else entry.index


def _visible(state: State) -> list[HistoryEntry]:
    return [e for e in state.history if e.kind not in ("finish", "fail")]


def _group_start(entries: list[HistoryEntry], start: int) -> int:
    """`start` moved back to the first entry of its model call, so a reply's calls stay together."""
    while 0 < start < len(entries) and entries[start].kind != "exception" \
            and turn_of(entries[start]) == turn_of(entries[start - 1]):
        start -= 1
    return start


@dataclass(frozen=True)
class Window:
    kept: list[HistoryEntry]
    fold: list[HistoryEntry]  # to summarise now (then summary_through moves to the last of them)
    omitted: int


def window(state: State, policy: ContextPolicy, memo: dict[str, Any], shrink: int = 0) -> Window:
    """Which steps the prompt shows verbatim, which are summarised now, how many go unshown."""
    through = int(memo.get("summary_through", -1)) if policy.summarise else -1
    pending = [e for e in _visible(state) if e.index > through]
    size = max(1, policy.last_turns // (4 ** shrink))
    if len(pending) <= size:
        return Window(pending, [], 0)
    start = _group_start(pending, len(pending) - size)
    older, kept = pending[:start], pending[start:]
    if not policy.summarise:
        return Window(kept, [], len(older))
    if len(older) >= policy.summarise_every or (shrink and older):
        return Window(kept, older, 0)
    return Window(pending, [], 0)  # the older steps stay verbatim until a whole chunk can be summarised


def replay(entry: HistoryEntry, state: State) -> tuple[str, dict[str, Any], Any]:
    """An entry as the call that proposed it: (function name, arguments, result)."""
    if entry.kind == "sleep":
        return SLEEP, {"seconds": (entry.detail.get("sleep_ms") or 0) / 1000}, {"slept": True}
    if entry.kind == "input":
        return WAIT, {"prompt": entry.detail.get("prompt", "")}, {"input": state.inputs.get(entry.step_key)}
    result = state.tool_results.get(entry.step_key)
    if result is None:
        shown: Any = {"status": "NOT_LOADED", "detail": "the answer is past the executor's memory window"}
    else:
        shown = {k: result.get(k) for k in ("status", "response", "error_code", "detail", "comment") if k in result}
    return api_name(entry.tool or ""), entry.detail.get("args", {}), shown


def exception_note(entry: HistoryEntry) -> str:
    return (f"Your previous reply could not be used ({entry.detail.get('kind')}: {entry.detail.get('detail')}). "
            "Reply again.")


def turns(entries: list[HistoryEntry], state: State, max_chars: int) -> list[Turn]:
    out: list[Turn] = []
    calls: list[Call] = []
    current: int | None = None
    for entry in entries:
        if entry.kind == "exception":
            if calls:
                out.append(Turn(tuple(calls)))
                calls, current = [], None
            out.append(Turn(note=exception_note(entry)))
            continue
        turn = turn_of(entry)
        if calls and turn != current:
            out.append(Turn(tuple(calls)))
            calls = []
        current = turn
        name, args, result = replay(entry, state)
        text = capped(json.dumps(result, sort_keys=True, ensure_ascii=False), max_chars, entry.step_key)
        calls.append(Call(call_id(entry.step_key), name, args, text))
    if calls:
        out.append(Turn(tuple(calls)))
    return out


def steps_as_text(entries: list[HistoryEntry], state: State, max_chars: int) -> str:
    """Steps for the summarisation call: one line each."""
    lines = []
    for entry in entries:
        if entry.kind == "exception":
            lines.append(f"step {entry.index}: an unusable reply ({entry.detail.get('kind')})")
            continue
        name, args, result = replay(entry, state)
        shown = capped(json.dumps(result, sort_keys=True, ensure_ascii=False), max_chars, entry.step_key)
        lines.append(f"step {entry.index}: {name}({json.dumps(args, sort_keys=True, ensure_ascii=False)}) -> {shown}")
    return "\n".join(lines)


def bounded_summary(text: str, max_chars: int) -> str:
    """At most max_chars characters and 3 bytes a character (the checkpoint's agent_state is bounded)."""
    text = text.strip()[:max_chars]
    while len(text.encode("utf-8")) > 12_000:
        text = text[:-200]
    return text


# ---------------------------------------------------------------------------------------------- the decider


class ModelDecider:
    """The provider-independent half of a model decider; a subclass sends one request (`_chat`)."""

    pure = False
    system = ""  # gen_ai.system

    def __init__(self, agent: AgentDefinition, config: ModelDeciderBase, api_key: str | None,
                 prices: dict[str, ModelPrice], tracer: Any = None) -> None:
        self.agent = agent
        self.config = config
        self._api_key = api_key  # held here only: never logged, traced or checkpointed
        self.prices = prices
        self.tracer = tracer or _TRACER
        self.names = {api_name(t.name): t.name for t in agent.tools}
        self.builtins = builtin_tools(config)
        if len(self.names) != len(agent.tools) or set(self.names) & set(self.builtins):
            raise ValueError(f"agent {agent.name}: tool names collide once made API-safe")
        self.functions = [(api_name(t.name), t.description, t.input_schema) for t in agent.tools]
        self.functions += [(name, spec["description"], spec["parameters"]) for name, spec in self.builtins.items()]
        self.result_validator = (jsonschema.Draft202012Validator(config.result_schema)
                                 if config.result_schema is not None else None)
        # Summaries made but not yet persisted (the main call failed after them): reused, not made again.
        self._summaries: OrderedDict[tuple[str, int, str], tuple[str, TokenUsage, float]] = OrderedDict()
        self.system_prompt = agent.prompt.system or DEFAULT_SYSTEM
        self._fixed_chars = len(self.system_prompt) + len(json.dumps(self.functions))

    # -- provider hooks

    async def _chat(self, layout: Layout, *, tools: bool, system: str) -> Reply:
        raise NotImplementedError

    def _server(self) -> tuple[str, int]:
        parts = urlsplit(self.config.base_url)  # type: ignore[attr-defined]
        return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)

    # -- deciding

    async def decide(self, ctx: DecisionContext) -> Proposal:
        state = ctx.state
        memo = dict(state.agent_state)
        queue = list(memo.get("queue") or [])
        if queue:  # the next call of a reply with several: its own step, no model call
            head = queue.pop(0)
            memo["queue"] = queue
            if not queue:
                memo.pop("queue")
            decision, node = self.decision(head["name"], head.get("args"), head.get("raw", ""),
                                           state.step_index, head["turn"], head["k"])
            return Proposal(decision, node, raw={"queued_call": head}, model=str(head.get("model") or ""),
                            agent_state=memo)
        spent, cost = TokenUsage(), 0.0
        policy = self.config.context
        reply: Reply | None = None
        failure: Classified | None = None
        made: list[tuple[str, int, str]] = []
        for shrink in range(MAX_SHRINKS + 1):
            plan = window(state, policy, memo, shrink)
            if plan.fold:
                try:
                    memo, used, used_cost, key = await self.summarise(ctx, memo, plan.fold)
                except Exception as exc:  # the summarisation call failed: the same table decides
                    failure = classify(exc)
                    if failure is None:
                        raise
                    break
                spent, cost = spent + used, cost + used_cost
                made.append(key)
            layout = Layout(json.dumps(ctx.input, sort_keys=True, ensure_ascii=False),
                            summary=str(memo.get("summary") or "") if policy.summarise else "",
                            omitted=plan.omitted,
                            turns=turns(plan.kept, state, max(100, policy.max_tool_answer_chars // (2 ** shrink))))
            if policy.max_prompt_tokens and shrink < MAX_SHRINKS \
                    and self.estimate(layout) > policy.max_prompt_tokens:
                continue  # over the policy's own budget: a smaller window before asking
            try:
                reply = await self.traced_chat(layout, tools=True, system=self.system_prompt, purpose="decide")
            except Exception as exc:
                failure = classify(exc)
                if failure is None:
                    raise
                if failure.verdict == Verdict.CONTEXT_TOO_LONG and shrink < MAX_SHRINKS:
                    log.info("run %s: the model said the context is too long; shrinking it", ctx.run_id)
                    continue
                break
            failure = None
            break
        index = state.step_index
        if failure is not None:
            proposal = self.failed(ctx, failure, index, spent, cost, memo)  # raises for a retry
        else:
            assert reply is not None
            proposal = self.proposal(reply, index, spent + reply.usage, cost + self.cost(reply.usage, reply.model),
                                     memo)
        for key in made:  # the proposal carries (and charges) them now
            self._summaries.pop(key, None)
        if made:  # journaled with the decision's history entry (executor/steps.py), for the record
            proposal = dataclasses.replace(proposal, extra={**proposal.extra, "summary": {
                "through": memo.get("summary_through"), "text": memo.get("summary", "")}})
        return proposal

    def estimate(self, layout: Layout) -> int:
        """The prompt's tokens, estimated at 4 characters a token (the policy's max_prompt_tokens); each call
        adds about 200 characters of message structure (ids, roles, types) to its name, arguments and result."""
        chars = self._fixed_chars + len(layout.input_text) + sum(len(text) for text in layout.preamble())
        for turn in layout.turns:
            chars += len(turn.note) + sum(len(c.name) + len(json.dumps(c.args)) + len(c.result) + 200
                                          for c in turn.calls)
        return chars // 4

    def failed(self, ctx: DecisionContext, failure: Classified, index: int, spent: TokenUsage, cost: float,
               memo: dict[str, Any]) -> Proposal:
        """A call that failed, per the table. Retries raise (nothing is recorded); the rest are decisions."""
        if failure.verdict == Verdict.RATE_LIMITED:
            assert failure.retry_after_s is not None
            raise DeciderRateLimited(f"{self.system} rate limit: {failure.detail}", failure.retry_after_s)
        if failure.verdict == Verdict.TRANSIENT:
            raise DeciderUnavailable(f"{self.system}: {failure.detail}")
        usage: dict[str, Any] = {"tokens": spent.total, "cost_usd": cost, "input_tokens": spent.input,
                                 "output_tokens": spent.output, "model": self.config.model,
                                 "agent_state": memo if memo != ctx.state.agent_state else None}
        if failure.verdict == Verdict.CONTEXT_TOO_LONG:
            return Proposal(Fail(f"context too long for {self.config.model} even after shrinking it: "
                                 f"{failure.detail}"), "fail", raw={"error": failure.detail}, **usage)
        if failure.verdict == Verdict.DEFINITE:
            return Proposal(Fail(f"model call refused for good: {failure.detail}"), "fail",
                            raw={"error": failure.detail}, **usage)
        kind: InvalidKind = "invalid_request" if failure.verdict == Verdict.INVALID_REQUEST else "parse_failure"
        return Proposal(Invalid(kind, failure.detail), f"model@{index}", raw={"error": failure.detail}, **usage)

    def cost(self, usage: TokenUsage, answered_model: str) -> float:
        price = self.prices.get(self.config.model) or self.prices.get(answered_model)
        return price_of(usage, price, self.config)

    async def summarise(self, ctx: DecisionContext, memo: dict[str, Any], fold: list[HistoryEntry],
                        ) -> tuple[dict[str, Any], TokenUsage, float, tuple[str, int, str]]:
        """The running summary extended by `fold`: one model call per chunk, persisted with the decision
        it came with (agent_state), so replay and takeover reuse it; its usage is charged with that
        decision. Until then it is kept here, so a retried main call does not make it again."""
        policy = self.config.context
        previous = str(memo.get("summary") or "")
        through = fold[-1].index
        key = (ctx.run_id, through, hashlib.sha256(previous.encode()).hexdigest()[:16])
        made = self._summaries.get(key)
        if made is None:
            text = steps_as_text(fold, ctx.state, min(policy.max_tool_answer_chars, 2000))
            prompt = (f"Previous notes:\n{previous or '(none)'}\n\nSteps "
                      f"{fold[0].index}-{through} of the run whose input was "
                      f"{json.dumps(ctx.input, sort_keys=True, ensure_ascii=False)}:\n{text}")
            system = policy.summary_prompt or SUMMARY_SYSTEM.format(chars=policy.summary_max_chars)
            reply = await self.traced_chat(Layout(prompt), tools=False, system=system, purpose="summarise")
            made = (bounded_summary(reply.text or previous, policy.summary_max_chars), reply.usage,
                    self.cost(reply.usage, reply.model))
            self._summaries[key] = made
            while len(self._summaries) > _MEMO_LIMIT:
                self._summaries.popitem(last=False)
        summary, usage, cost = made
        return {**memo, "summary": summary, "summary_through": through}, usage, cost, key

    async def traced_chat(self, layout: Layout, *, tools: bool, system: str, purpose: str) -> Reply:
        host, port = self._server()
        attributes: dict[str, Any] = {
            "gen_ai.system": self.system, "gen_ai.provider.name": self.system, "gen_ai.operation.name": "chat",
            "gen_ai.request.model": self.config.model, "server.address": host, "server.port": port,
            AGENT: self.agent.name, "agentrt.model_call": purpose}
        if self.config.temperature is not None:
            attributes["gen_ai.request.temperature"] = float(self.config.temperature)
        if self.config.max_output_tokens:
            attributes["gen_ai.request.max_tokens"] = int(self.config.max_output_tokens)
        with self.tracer.start_as_current_span(f"chat {self.config.model}", kind=SpanKind.CLIENT,
                                               attributes=attributes, record_exception=False,
                                               set_status_on_exception=False) as span:
            try:
                reply = await self._chat(layout, tools=tools, system=system)
            except Exception as exc:
                verdict = classify(exc)
                span.set_attribute("error.type", verdict.verdict.value if verdict else type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, (verdict.detail if verdict else str(exc))[:200]))
                raise
            if span.is_recording():
                span.set_attributes(self.usage_attributes(reply))
            return reply

    def usage_attributes(self, reply: Reply) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "gen_ai.response.model": reply.model, "gen_ai.usage.input_tokens": reply.usage.input,
            "gen_ai.usage.output_tokens": reply.usage.output,
            "gen_ai.usage.cache_read.input_tokens": reply.usage.cache_read,
            "gen_ai.usage.cache_creation.input_tokens": reply.usage.cache_write,
            COST_ATTRIBUTE: self.cost(reply.usage, reply.model)}
        if reply.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = (reply.finish_reason,)
        if reply.response_id:
            attributes["gen_ai.response.id"] = reply.response_id
        return attributes

    def proposal(self, reply: Reply, index: int, spent: TokenUsage, cost: float, memo: dict[str, Any]) -> Proposal:
        usage: dict[str, Any] = {"tokens": spent.total, "cost_usd": cost, "model": reply.model or self.config.model,
                                 "input_tokens": spent.input, "output_tokens": spent.output,
                                 "extra": {"finish_reason": reply.finish_reason, "response_id": reply.response_id,
                                           "cached_input_tokens": spent.cache_read,
                                           "cache_write_input_tokens": spent.cache_write}}

        def proposed(decision: Decision, node: str, state: dict[str, Any] = memo) -> Proposal:
            return Proposal(decision, node, raw=reply.raw, agent_state=state, **usage)

        if reply.filtered:
            return proposed(Invalid("content_filter", "the reply was withheld by the content filter"),
                            f"model@{index}")
        if reply.refusal:
            return proposed(Invalid("refusal", reply.refusal[:1000]), f"model@{index}")
        calls = reply.calls if self.config.parallel_tool_calls else reply.calls[:1]
        if not calls:
            if reply.finish_reason in ("length", "max_tokens", "max_output_tokens"):
                return proposed(Invalid("parse_failure", "the reply was cut at the output-token limit"),
                                f"model@{index}")
            if reply.text.strip():
                decision, node = self.final_text(reply.text, index)
                return proposed(decision, node)
            return proposed(Invalid("empty", "neither a tool call nor content"), f"model@{index}")
        rest = [{"name": c.name, "args": c.arguments, "raw": c.raw[:4000] if c.arguments is None else "",
                 "turn": index, "k": k, "model": reply.model} for k, c in enumerate(calls[1:], start=1)]
        state = {**memo, "queue": rest} if rest else memo
        decision, node = self.decision(calls[0].name, calls[0].arguments, calls[0].raw, index, index,
                                       0 if rest else None)
        return proposed(decision, node, state)

    def final_text(self, text: str, index: int) -> tuple[Decision, str]:
        """A reply of text only: the final answer (parsed and checked when the agent declares its schema)."""
        if self.result_validator is None:
            return Finish({"answer": text}), "finish"
        try:
            result = json.loads(text)
        except ValueError:
            return Invalid("parse_failure", "the final answer is not the JSON the result schema asks for"), \
                f"model@{index}"
        return self.finished(result, index)

    def finished(self, result: Any, index: int) -> tuple[Decision, str]:
        if self.result_validator is not None:
            errors = sorted(self.result_validator.iter_errors(result), key=lambda e: list(e.path))
            if errors:
                where = "/".join(str(p) for p in errors[0].path) or "(result)"
                return Invalid("invalid_arguments", f"{FINISH}: result: {where}: {errors[0].message}"), \
                    f"model@{index}"
        return Finish(result), "finish"

    def decision(self, name: str, args: Any, raw: str, index: int, turn: int, k: int | None,
                 ) -> tuple[Decision, str]:
        """One tool call as a decision. Its node names the reply it came from: `<name>@<turn>` for a reply's
        only call, `<name>@<turn>.<k>` for the k-th of several (so a replay can regroup them)."""
        at = f"{turn}" if k is None else f"{turn}.{k}"
        if args is None:
            return Invalid("parse_failure", f"arguments of {name} are not JSON: {raw[:200]}"), f"model@{index}"
        if not isinstance(args, dict):
            return Invalid("parse_failure", f"arguments of {name} are not a JSON object"), f"model@{index}"
        if name == FINISH:
            return self.finished(args.get("result"), index)
        if name == SLEEP and SLEEP in self.builtins:
            seconds = args.get("seconds")
            if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
                return Invalid("invalid_arguments", f"{SLEEP}: seconds must be a positive number"), f"model@{index}"
            return Sleep(max(1, int(seconds * 1000))), f"sleep@{at}"
        if name == WAIT and WAIT in self.builtins:
            return WaitForInput(str(args.get("prompt") or "")), f"input@{at}"
        if name not in self.names:
            return Invalid("unknown_tool", f"no tool named {name!r}"), f"model@{index}"
        tool = self.names[name]
        return ToolCall(tool, args), f"{tool}@{at}"

    async def close(self) -> None:
        return None


def parse_arguments(text: str | None) -> Any:
    """Tool-call arguments as JSON text (OpenAI's APIs): the value, or None when the text is not JSON."""
    try:
        return json.loads(text or "{}")
    except ValueError:
        return None
