"""The model deciders' wire side: one classification of a failed model call for both SDKs (their own
retries are off), the provider's token usage and its price, and the reply as the deciders read it.
executor/deciders/llm.py lays the conversation out and turns replies into decisions; docs/models.md
has the classification table.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import anthropic
import openai

from executor.agents import ModelDeciderBase
from executor.config import ModelPrice

MAX_RETRY_AFTER_S = 6 * 3600.0  # a longer retry-after is taken as this (the run's deadline still applies)


# ---------------------------------------------------------------------------------------------- errors


class Verdict(StrEnum):
    """What a failed model call means for the run (docs/models.md, the classification table)."""

    RATE_LIMITED = "rate_limited"  # retry at the time the provider gave, no attempt spent
    TRANSIENT = "transient"  # retry with the scheduler's backoff (spends an attempt)
    CONTEXT_TOO_LONG = "context_too_long"  # shrink the context; past that, a definite failure
    DEFINITE = "definite"  # no retry can help: the run fails with the reason
    INVALID_REQUEST = "invalid_request"  # an invalid decision, recorded and retried up to the policy's bound
    BAD_RESPONSE = "bad_response"  # an answer that is no model reply: an invalid decision (parse_failure)


@dataclass(frozen=True)
class Classified:
    verdict: Verdict
    detail: str
    retry_after_s: float | None = None


class NotAReply(Exception):
    """A 200 whose JSON is not the API's reply (no choices, no content...)."""


def not_a_reply_when_malformed(parse: Callable[[Any, Any], Reply]) -> Callable[[Any, Any], Reply]:
    """A reply parser whose answer lacks what the API promises raises NotAReply, not a stray error (the
    SDKs do not validate answers: a missing field is None, a wrong one any type)."""
    @functools.wraps(parse)
    def checked(self: Any, answer: Any) -> Reply:
        try:
            return parse(self, answer)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise NotAReply(f"the answer is not a reply of this API: {type(exc).__name__}: {exc}") from None
    return checked


_CONTEXT_TOO_LONG = re.compile(r"context[_ ]length|context window|maximum context|prompt is too long|"
                               r"too many (input )?tokens|input is too long|reduce the length", re.I)
_DEFINITE_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "billing_error",
                             "model_not_found", "invalid_api_key"})
_STATUS_ERRORS = (openai.APIStatusError, anthropic.APIStatusError)
_CONNECTION_ERRORS = (openai.APIConnectionError, anthropic.APIConnectionError)  # timeouts are a subclass
_SDK_ERRORS = (openai.OpenAIError, anthropic.AnthropicError)


def retry_after(headers: Any) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `retry-after` (seconds, or an HTTP date read against the
    response's own Date header, never this host's clock); None when absent or unreadable."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        at, now = email.utils.parsedate_to_datetime(value), email.utils.parsedate_to_datetime(headers.get("date"))
    except (TypeError, ValueError):
        return None
    return max(0.0, (at - now).total_seconds()) if isinstance(at, dt.datetime) and isinstance(now, dt.datetime) \
        else None


def _error_code(exc: Any) -> str:
    """The provider's stable code: openai's `error.code` (or `type`), anthropic's error_code (or `type`)."""
    for name in ("code", "error_code", "type"):
        value = getattr(exc, name, None)
        if isinstance(value, str) and value:
            return value
    return ""


def classify(exc: BaseException) -> Classified | None:
    """One table for both SDKs (their own retries are off); None: not a model call's failure."""
    if isinstance(exc, json.JSONDecodeError):  # both SDKs raise it bare for a 200 whose body is not JSON
        return Classified(Verdict.BAD_RESPONSE, f"the endpoint answered with a body that is not JSON: {exc}")
    if isinstance(exc, _CONNECTION_ERRORS):
        return Classified(Verdict.TRANSIENT, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, NotAReply | openai.APIResponseValidationError | anthropic.APIResponseValidationError):
        return Classified(Verdict.BAD_RESPONSE, f"the answer is not a model reply: {exc}")
    if isinstance(exc, _STATUS_ERRORS):
        status, code = exc.status_code, _error_code(exc)
        text = f"HTTP {status}" + (f" {code}" if code else "") + f": {str(getattr(exc, 'message', exc))[:500]}"
        if status == 429:
            if code in _DEFINITE_CODES:
                return Classified(Verdict.DEFINITE, text)
            wait = retry_after(exc.response.headers)
            if wait is not None:
                return Classified(Verdict.RATE_LIMITED, text, min(wait, MAX_RETRY_AFTER_S))
            return Classified(Verdict.TRANSIENT, text)
        if status == 413 or (400 <= status < 500 and (code == "context_length_exceeded"
                                                       or _CONTEXT_TOO_LONG.search(text))):
            return Classified(Verdict.CONTEXT_TOO_LONG, text)
        if status in (408, 409) or status >= 500:  # 529 overloaded, 503, 504, 500...
            return Classified(Verdict.TRANSIENT, text)
        if status in (401, 402, 403, 404) or code in _DEFINITE_CODES:
            return Classified(Verdict.DEFINITE, text)
        return Classified(Verdict.INVALID_REQUEST, text)
    if isinstance(exc, _SDK_ERRORS):
        return Classified(Verdict.TRANSIENT, f"{type(exc).__name__}: {exc}")
    return None


# ---------------------------------------------------------------------------------------------- usage


@dataclass(frozen=True)
class TokenUsage:
    """A call's tokens as the provider counted them. `input` is every prompt token, cached ones included."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(self.input + other.input, self.output + other.output,
                          self.cache_read + other.cache_read, self.cache_write + other.cache_write)

    @property
    def total(self) -> int:
        return self.input + self.output


def price_of(usage: TokenUsage, price: ModelPrice | None, config: ModelDeciderBase) -> float:
    """USD for `usage`: the definition's per-1k prices when it sets any, else the executor's table."""
    if config.usd_per_1k_input_tokens or config.usd_per_1k_output_tokens:
        return (usage.input * config.usd_per_1k_input_tokens + usage.output * config.usd_per_1k_output_tokens) / 1000
    if price is None:
        return 0.0
    cached_read = price.cached_input if price.cached_input is not None else price.input
    cached_write = price.cache_write if price.cache_write is not None else price.input
    fresh = max(0, usage.input - usage.cache_read - usage.cache_write)
    return (fresh * price.input + usage.cache_read * cached_read + usage.cache_write * cached_write
            + usage.output * price.output) / 1_000_000


# ---------------------------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class ToolUse:
    name: str
    arguments: Any  # the parsed arguments (a dict when usable), or None when `raw` was not JSON
    raw: str = ""


@dataclass(frozen=True)
class Reply:
    """One model answer, whatever the API."""

    calls: list[ToolUse]
    text: str = ""
    refusal: str = ""
    filtered: bool = False
    finish_reason: str = ""
    model: str = ""
    response_id: str = ""
    usage: TokenUsage = TokenUsage()
    raw: Any = None  # what the checkpoint records of it (the assistant message, no prompt)
