"""The model deciders' one error table, fed by the real SDKs (retries off) talking to loopback fake providers
that answer with each API's real status codes, headers and error bodies."""

from __future__ import annotations

import asyncio
import json
import socket

import anthropic
import openai
import pytest
from model_fakes import FakeProvider, Raw, anthropic_error, anthropic_text, openai_error

from executor.deciders.llm_wire import MAX_RETRY_AFTER_S, Verdict, classify, retry_after

DATE = "Sun, 06 Dec 2026 03:00:00 GMT"


async def openai_failure(answer, api: str = "chat") -> BaseException:
    async with FakeProvider([answer]) as fake:
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake.openai_url, max_retries=0, timeout=5.0)
        try:
            if api == "chat":
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            else:
                await client.responses.create(model="m", input="hi")
        except Exception as exc:
            return exc
        finally:
            await client.close()
    raise AssertionError("the call did not fail")


async def anthropic_failure(answer) -> BaseException:
    async with FakeProvider([answer]) as fake:
        client = anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=fake.url, max_retries=0, timeout=5.0)
        try:
            await client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        except Exception as exc:
            return exc
        finally:
            await client.close()
    raise AssertionError("the call did not fail")


async def test_a_429_with_retry_after_is_retried_at_that_time():
    exc = await openai_failure(openai_error(429, "Rate limit reached", type_="requests", code="rate_limit_exceeded",
                                            headers={"retry-after": "7"}))
    verdict = classify(exc)
    assert isinstance(exc, openai.RateLimitError) and verdict is not None
    assert (verdict.verdict, verdict.retry_after_s) == (Verdict.RATE_LIMITED, 7.0)
    exc = await anthropic_failure(anthropic_error(429, "rate_limit_error", "Number of request tokens has exceeded "
                                                  "your per-minute rate limit", headers={"retry-after": "30"}))
    verdict = classify(exc)
    assert isinstance(exc, anthropic.RateLimitError) and verdict is not None
    assert (verdict.verdict, verdict.retry_after_s) == (Verdict.RATE_LIMITED, 30.0)


async def test_openai_retry_after_ms_wins_and_a_huge_one_is_capped():
    exc = await openai_failure(openai_error(429, "slow down", headers={"retry-after-ms": "1500", "retry-after": "9"}))
    assert classify(exc).retry_after_s == 1.5  # type: ignore[union-attr]
    exc = await openai_failure(openai_error(429, "slow down", headers={"retry-after": str(10 ** 7)}))
    assert classify(exc).retry_after_s == MAX_RETRY_AFTER_S  # type: ignore[union-attr]


async def test_a_429_without_retry_after_backs_off_and_insufficient_quota_is_never_retried():
    exc = await openai_failure(openai_error(429, "Rate limit reached", code="rate_limit_exceeded"))
    assert classify(exc).verdict == Verdict.TRANSIENT  # type: ignore[union-attr]
    exc = await openai_failure(openai_error(429, "You exceeded your current quota", type_="insufficient_quota",
                                            code="insufficient_quota", headers={"retry-after": "1"}))
    verdict = classify(exc)
    assert isinstance(exc, openai.RateLimitError) and verdict is not None
    assert verdict.verdict == Verdict.DEFINITE and "insufficient_quota" in verdict.detail


@pytest.mark.parametrize("status,type_", [(529, "overloaded_error"), (503, "api_error"), (500, "api_error"),
                                          (504, "timeout_error")])
async def test_overloaded_and_server_errors_back_off(status, type_):
    exc = await anthropic_failure(anthropic_error(status, type_, "Overloaded"))
    assert isinstance(exc, anthropic.InternalServerError)
    if status == 529:
        assert isinstance(exc, anthropic.OverloadedError)
    assert classify(exc).verdict == Verdict.TRANSIENT  # type: ignore[union-attr]
    exc = await openai_failure(openai_error(status, "The server had an error", type_="server_error"))
    assert classify(exc).verdict == Verdict.TRANSIENT  # type: ignore[union-attr]


async def test_context_too_long_is_recognised_for_each_api():
    exc = await openai_failure(openai_error(400, "This model's maximum context length is 128000 tokens. However, "
                                                 "your messages resulted in 130000 tokens.",
                                            code="context_length_exceeded"))
    assert classify(exc).verdict == Verdict.CONTEXT_TOO_LONG  # type: ignore[union-attr]
    exc = await openai_failure(openai_error(400, "Your input exceeds the context window of this model.",
                                            code="context_length_exceeded"), api="responses")
    assert classify(exc).verdict == Verdict.CONTEXT_TOO_LONG  # type: ignore[union-attr]
    exc = await anthropic_failure(anthropic_error(400, "invalid_request_error",
                                                  "prompt is too long: 210000 tokens > 200000 maximum"))
    assert classify(exc).verdict == Verdict.CONTEXT_TOO_LONG  # type: ignore[union-attr]
    exc = await anthropic_failure(anthropic_error(413, "request_too_large", "Request exceeds the maximum size"))
    assert classify(exc).verdict == Verdict.CONTEXT_TOO_LONG  # type: ignore[union-attr]


async def test_invalid_requests_are_invalid_decisions_and_auth_failures_definite():
    exc = await anthropic_failure(anthropic_error(400, "invalid_request_error", "tools.0.name: String should match"))
    assert classify(exc).verdict == Verdict.INVALID_REQUEST  # type: ignore[union-attr]
    exc = await openai_failure(openai_error(422, "Unprocessable"))
    assert classify(exc).verdict == Verdict.INVALID_REQUEST  # type: ignore[union-attr]
    for status, type_ in ((401, "authentication_error"), (403, "permission_error"), (404, "not_found_error")):
        exc = await anthropic_failure(anthropic_error(status, type_, "no"))
        assert classify(exc).verdict == Verdict.DEFINITE  # type: ignore[union-attr]


async def test_a_200_that_is_not_json_is_a_bad_response_not_a_crash():
    garbled = Raw("<html>gateway</html>", content_type="application/json")
    for failure in (await openai_failure(garbled), await openai_failure(garbled, api="responses"),
                    await anthropic_failure(garbled)):
        assert isinstance(failure, json.JSONDecodeError)  # bare, from both SDKs
        assert classify(failure).verdict == Verdict.BAD_RESPONSE  # type: ignore[union-attr]


async def test_connection_refused_and_timeouts_back_off():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = openai.AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=2)
    with pytest.raises(openai.APIConnectionError) as refused:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    await client.close()
    assert classify(refused.value).verdict == Verdict.TRANSIENT  # type: ignore[union-attr]

    # A server that accepts and never answers within the timeout.
    server = await asyncio.start_server(lambda r, w: asyncio.sleep(5), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = openai.AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=0.5)
    try:
        with pytest.raises(openai.APITimeoutError) as timed_out:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
        server.close()
    assert classify(timed_out.value).verdict == Verdict.TRANSIENT  # type: ignore[union-attr]


def test_retry_after_forms():
    assert retry_after({"retry-after": "12"}) == 12.0
    assert retry_after({"retry-after-ms": "250"}) == 0.25
    # An HTTP date is read against the response's own Date header, never this host's clock.
    assert retry_after({"retry-after": "Sun, 06 Dec 2026 03:01:30 GMT", "date": DATE}) == 90.0
    assert retry_after({"retry-after": "Sun, 06 Dec 2026 03:01:30 GMT"}) is None
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


def test_what_is_not_a_model_failure_is_not_classified():
    assert classify(ValueError("x")) is None
    assert classify(KeyError("choices")) is None


async def test_a_well_formed_answer_is_no_failure():
    async with FakeProvider([anthropic_text("hello")]) as fake:
        client = anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=fake.url, max_retries=0)
        message = await client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        await client.close()
    assert message.content[0].text == "hello"  # type: ignore[union-attr]
    assert fake.headers[0]["Authorization"] == "Bearer sk-ant-test"  # anthropic 2.x sends its key so
