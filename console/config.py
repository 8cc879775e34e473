"""The console's settings (AGENTRT_CONSOLE_*, or the config file's `console:` section)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.config import ComponentSettings


class ConsoleSettings(ComponentSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTRT_CONSOLE_", extra="ignore")
    section: ClassVar[str] = "console"
    service_name: str = "agentrt-console"

    # The scheduler's RunService (the only thing the console talks to).
    scheduler_addr: str = "127.0.0.1:50051"
    # Where the console serves HTTP.
    listen_addr: str = "127.0.0.1:8080"
    # TLS to the scheduler, as the CLI's --tls-* flags: its CA (TLS on), a client pair for mutual TLS.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    # Send the signed-in person's credential to a non-loopback scheduler in clear.
    insecure: bool = False
    # Encrypts and signs the session cookie. Empty = a random key per process (every session ends
    # when the console restarts, and replicas do not share sessions): set it for more than one replica.
    session_secret: str = ""
    # A session ends this long after sign-in.
    session_max_age_s: int = Field(8 * 3600, ge=60, le=7 * 86400)
    # The Secure cookie attribute. Browsers keep Secure cookies from http://localhost too, so only a
    # console served over plain HTTP on another name (never do it) needs it off.
    cookie_secure: bool = True
    # A link to the tracing UI for a run's trace id: "{trace_id}" is replaced ("" = no link).
    trace_url_template: str = ""
    # Live parts (SSE) poll the scheduler this often.
    poll_interval_ms: int = Field(1000, ge=100, le=60_000)
    # Runs per page on the runs list.
    page_size: int = Field(50, ge=1, le=500)
