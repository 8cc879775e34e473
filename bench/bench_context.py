"""Bounded-context benchmark (issue 29): does a long LLM run's prompt stay flat once its window fills?

    python -m bench.bench_context [--steps 2000] [--cache-steps 200] [--max-minutes 20]

One scratch database on AGENTRT_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/postgres), dropped at the end; one scheduler process and one
executor process (`python -m cli scheduler|executor`, log level WARNING), and, in this
process, a loopback fake model provider speaking the wire formats of OpenAI's Chat Completions and
Anthropic's Messages API. The fake counts each request's prompt tokens itself (its JSON length / 4),
reports them as the provider would (usage, with cached tokens), and answers:
  a decision request (one with tools): one call of the `step` tool, then agentrt_finish after --steps;
  a summarisation request (no tools): the previous notes plus one line for the steps it was shown.

1. Long run: an `openai` agent with the context policy last_turns 40, tool answers capped at 400
   characters, summarise every 16 steps; one run of --steps steps whose python tool answers
   1,024 characters of text. Prompt tokens of every decision call, in order.
2. Caching: an `anthropic` agent (prompt_caching on, the same policy) for --cache-steps steps. The fake
   emulates Anthropic's cache as documented: a request reads the longest prefix ending at one of its
   cache_control breakpoints that an earlier request wrote.

Figures (value; baseline; ratio = value / baseline):
  prompt_tokens_late_vs_early   mean prompt tokens of the last 100 decision calls; baseline = mean of
                                calls 100-200 (the window is full by then); target ratio <= 1.2
  prompt_tokens_max             the largest decision prompt of the run; baseline = what the last call's
                                prompt would have been with every step shown (estimated from the tokens
                                per shown step)
  summarisation_calls           summarisation calls of the long run; baseline = steps past the window / 16
  cached_prompt_share           cache-read prompt tokens / all prompt tokens of the caching run (Anthropic)
Progress goes to stderr; stdout ends with one JSON line per figure. Exit status 0 when the target is met.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import yaml
from aiohttp import web

from bench._core_procs import SchedulerProc, stop_process
from bench._pg import emit, figure, free_port, log, scratch_database
from scheduler.store.migrate import migrate

BENCH = "context"
ROOT = Path(__file__).resolve().parent.parent
TARGET_LATE_VS_EARLY = 1.2
WINDOW, CHUNK, CAP = 40, 16, 400
STOPPED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "PAUSED_INDOUBT", "PAUSED_HUMAN"})


def answer_1024(request: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The tool: 1,024 characters of text derived from the step (a result the policy must cap)."""
    seed = hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()
    return {"text": (seed * 16)[:1024]}


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


class FakeModel:
    """Answers both APIs; counts decision prompts and summarisation calls."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.decisions = 0
        self.prompt_tokens: list[int] = []  # per decision call
        self.summaries = 0
        self.cache_read = 0
        self.cache_total = 0
        self._written: set[str] = set()

    def next_call(self) -> tuple[str, dict[str, Any]]:
        self.decisions += 1
        if self.decisions > self.steps:
            return "agentrt_finish", {"result": {"steps": self.steps}}
        return "step", {"i": self.decisions}

    def notes(self, previous: str, shown: str) -> str:
        numbers = [line.split(":")[0].removeprefix("step ") for line in shown.splitlines() if line.startswith("step ")]
        line = f"steps {numbers[0]}-{numbers[-1]}: stepped, all ok" if numbers else "nothing new"
        return f"{previous}\n{line}".strip()

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = tokens(json.dumps(body.get("tools", []))) + tokens(json.dumps(body["messages"]))
        usage = {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}
        if "tools" not in body:
            self.summaries += 1
            text = body["messages"][-1]["content"]
            previous = text.split("Previous notes:\n", 1)[1].split("\n\nSteps ", 1)[0]
            message: dict[str, Any] = {"role": "assistant",
                                       "content": self.notes("" if previous == "(none)" else previous, text)}
        else:
            self.prompt_tokens.append(prompt)
            name, args = self.next_call()
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}
        return web.json_response({"id": "chatcmpl-bench", "object": "chat.completion", "created": 1,
                                  "model": "bench-gpt", "usage": usage,
                                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    async def messages(self, request: web.Request) -> web.Response:
        body = await request.json()
        parts: list[tuple[Any, bool]] = [(t, False) for t in body.get("tools", [])]
        parts += [(b, "cache_control" in b) for b in body.get("system", [])]
        for m in body["messages"]:
            parts += [({"role": m["role"], **b}, "cache_control" in b) for b in m["content"]]
        # As Anthropic documents it: the cache is keyed by the content before a block boundary (the
        # markers themselves are not content); a request reads the longest cached prefix ending at any
        # block boundary up to its last breakpoint and writes the prefix at each of its breakpoints.
        total = read = last = 0
        fresh = False
        prefix = hashlib.sha256()
        for part, breakpoint in parts:
            prefix.update(json.dumps({k: v for k, v in part.items() if k != "cache_control"}, sort_keys=True).encode())
            total += tokens(json.dumps(part))
            digest = prefix.hexdigest()
            if digest in self._written:
                read = total
            if breakpoint:
                fresh = digest not in self._written
                self._written.add(digest)
                last = total
        read = min(read, last)
        written = last - read if fresh else 0
        if "tools" in body:
            self.cache_read += read
            self.cache_total += total
        usage = {"input_tokens": total - read - written, "cache_read_input_tokens": read,
                 "cache_creation_input_tokens": written, "output_tokens": 20}
        if "tools" not in body:
            self.summaries += 1
            text = body["messages"][0]["content"][0]["text"]
            previous = text.split("Previous notes:\n", 1)[1].split("\n\nSteps ", 1)[0]
            content: list[dict[str, Any]] = [{"type": "text", "text": self.notes(
                "" if previous == "(none)" else previous, text)}]
        else:
            self.prompt_tokens.append(total)
            name, args = self.next_call()
            content = [{"type": "tool_use", "id": "toolu_1", "name": name, "input": args}]
        return web.json_response({"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench-claude",
                                  "content": content, "stop_reason": "tool_use", "stop_sequence": None,
                                  "usage": usage})


async def serve(model: FakeModel) -> tuple[web.AppRunner, str]:
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", model.chat)
    app.router.add_post("/v1/messages", model.messages)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def agent_file(directory: Path, name: str, decider: dict[str, Any]) -> None:
    definition = {
        "name": name, "version": "1",
        "decider": {**decider, "model": "bench-model", "allow_sleep": False, "allow_wait_for_input": False,
                    "context": {"last_turns": WINDOW, "max_tool_answer_chars": CAP, "summarise": True,
                                "summarise_every": CHUNK}},
        "prompt": {"system": "Call the step tool until it has been called enough times."},
        "tools": [{"name": "step", "kind": "python", "callable": "bench.bench_context:answer_1024",
                   "contract": {"idempotent": True},
                   "input_schema": {"type": "object", "properties": {"i": {"type": "integer"}}}}],
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))


def start_executor(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cli", "executor"], cwd=ROOT, env=env)


async def one_run(db_url: str, scheduler: SchedulerProc, agents: Path, agent: str, limit_s: float) -> str:
    """Submits one run of `agent`, serves it with one executor process; its final status (or where it stopped)."""
    conn = await asyncpg.connect(db_url)
    env = {**os.environ, "AGENTRT_SCHEDULER_ADDR": scheduler.addr, "AGENTRT_AGENTS_PATH": str(agents),
           "AGENTRT_SLOTS": "1", "AGENTRT_HEALTH_ADDR": "", "AGENTRT_LOG_LEVEL": "WARNING",
           "AGENTRT_OPENAI_API_KEY": "bench-key", "AGENTRT_ANTHROPIC_API_KEY": "bench-key",
           "AGENTRT_CLAIM_WAIT_MS": "1000"}
    env.pop("AGENTRT_CONFIG_FILE", None)
    executor: subprocess.Popen[bytes] | None = None
    try:
        run_id = await conn.fetchval(
            "INSERT INTO agent_runs (id, tenant_id, agent_name, agent_version, input, labels, max_attempts, "
            "next_attempt_at) VALUES (gen_random_uuid(), 'tenant-bench', $1, '', '{\"task\": \"step\"}'::jsonb, "
            "'{}'::jsonb, 12, clock_timestamp()) RETURNING id", agent)
        executor = start_executor(env)
        deadline = time.monotonic() + limit_s
        status = "QUEUED"
        while time.monotonic() < deadline and executor.poll() is None:
            status = await conn.fetchval("SELECT status FROM agent_runs WHERE id = $1", run_id)
            if status in STOPPED:
                break
            await asyncio.sleep(0.5)
        if status not in STOPPED:
            status = f"{status} (stopped waiting: {'executor exited' if executor.poll() is not None else 'time'})"
        return str(status)
    finally:
        if executor is not None:
            stop_process(executor)
        await conn.close()


def mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else float("nan")


def known(value: float) -> float | None:
    """None for what could not be measured (JSON has no NaN)."""
    return None if math.isnan(value) else value


async def run(args: argparse.Namespace) -> int:
    long_model, cache_model = FakeModel(args.steps), FakeModel(args.cache_steps)
    figures: list[dict[str, Any]] = []
    async with scratch_database("agentrt_bench_context") as db_url:
        conn = await asyncpg.connect(db_url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        scheduler = SchedulerProc(db_url)
        scheduler.start()
        runners: list[web.AppRunner] = []
        try:
            await scheduler.wait_serving()
            with tempfile.TemporaryDirectory(prefix="agentrt-bench-context-") as tmp:
                runner, url = await serve(long_model)
                runners.append(runner)
                agent_file(Path(tmp) / "long", "bench-context", {"kind": "openai", "base_url": f"{url}/v1"})
                log(f"long run: {args.steps} steps, openai chat completions, window {WINDOW}, "
                    f"summaries every {CHUNK} ...")
                started = time.monotonic()
                long_status = await one_run(db_url, scheduler, Path(tmp) / "long", "bench-context",
                                            args.max_minutes * 60)
                log(f"  {long_status} after {time.monotonic() - started:.0f} s: {len(long_model.prompt_tokens)} "
                    f"decision calls, {long_model.summaries} summarisation calls")
                runner, url = await serve(cache_model)
                runners.append(runner)
                agent_file(Path(tmp) / "cache", "bench-cache", {"kind": "anthropic", "base_url": url})
                log(f"caching run: {args.cache_steps} steps, anthropic messages with cache_control ...")
                cache_status = await one_run(db_url, scheduler, Path(tmp) / "cache", "bench-cache",
                                             args.max_minutes * 60)
                log(f"  {cache_status}: cache reads {cache_model.cache_read} of {cache_model.cache_total} "
                    "prompt tokens")
        finally:
            for runner in runners:
                await runner.cleanup()
            scheduler.stop()
    calls = long_model.prompt_tokens
    early, late = calls[100:200], calls[-100:]
    ratio = mean(late) / mean(early) if len(calls) >= 300 else float("nan")
    figures.append(figure(BENCH, "prompt_tokens_late_vs_early", mean(late), "tokens", known(mean(early)),
                          known(ratio), target=TARGET_LATE_VS_EARLY, decision_calls=len(calls), status=long_status,
                          per_100_calls=[round(mean(calls[i:i + 100])) for i in range(0, len(calls), 100)]))
    shown_full = calls[200] / (WINDOW + CHUNK / 2) if len(calls) > 200 else float("nan")
    unbounded = shown_full * args.steps
    figures.append(figure(BENCH, "prompt_tokens_max", max(calls) if calls else float("nan"), "tokens",
                          known(unbounded), known(max(calls) / unbounded) if calls else None,
                          baseline_name="estimated prompt of the last call with every step shown"))
    expected = max(0, args.steps - WINDOW) / CHUNK
    figures.append(figure(BENCH, "summarisation_calls", long_model.summaries, "calls", expected,
                          long_model.summaries / expected if expected else None))
    share = cache_model.cache_read / cache_model.cache_total if cache_model.cache_total else float("nan")
    figures.append(figure(BENCH, "cached_prompt_share", share, "fraction", None, None, steps=args.cache_steps,
                          status=cache_status))
    for item in figures:  # JSON has no NaN: what could not be measured is null
        item["value"] = known(item["value"]) if isinstance(item["value"], float) else item["value"]
    emit(figures)
    met = long_status == "COMPLETED" and ratio <= TARGET_LATE_VS_EARLY
    return 0 if met else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_context")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--cache-steps", type=int, default=200)
    parser.add_argument("--max-minutes", type=float, default=20.0)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
