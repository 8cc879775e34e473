"""Kafka connection settings shared by the relay and the consumer library.

One place turns settings (bootstrap servers, SASL, TLS) into aiokafka keyword
arguments, so a relay and a downstream consumer configured from the same file
connect the same way.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import SecretStr, field_validator, model_validator

from shared.config import ComponentSettings

_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")

# Broker errors that mean "this record will never be accepted as it is";
# anything else is treated as transient and retried.
PERMANENT_RECORD_ERRORS: tuple[str, ...] = (
    "MessageSizeTooLargeError",
    "RecordListTooLargeError",
    "CorruptRecordException",
    "InvalidRecordError",
    "UnsupportedForMessageFormatError",
    "InvalidTimestampError",
)


def is_permanent_record_error(exc: BaseException) -> bool:
    return type(exc).__name__ in PERMANENT_RECORD_ERRORS


class KafkaClientSettings(ComponentSettings):
    """Connection options for a Kafka client (env AGENTRT_KAFKA_*, or the config file section)."""

    section: ClassVar[str] = "kafka"

    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_client_id: str = "agentrt"
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: str | None = None
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None
    kafka_request_timeout_ms: int = 10_000
    # aiokafka logs every failed reconnect at ERROR; agentrt reports broker trouble itself.
    kafka_log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "CRITICAL"

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap_is_host_port_list(cls, value: str) -> str:
        servers = [part.strip() for part in value.split(",") if part.strip()]
        if not servers:
            raise ValueError("must name at least one host:port")
        for server in servers:
            match = _HOST_PORT.match(server)
            if not match or not 0 < int(match.group(2)) < 65536:
                raise ValueError(f"{server!r} is not host:port")
        return ",".join(servers)

    @model_validator(mode="after")
    def _sasl_needs_credentials(self) -> KafkaClientSettings:
        if self.kafka_security_protocol.startswith("SASL_") and not (
                self.kafka_sasl_username and self.kafka_sasl_password):
            raise ValueError("kafka_security_protocol SASL_* needs kafka_sasl_username and kafka_sasl_password")
        return self

    def bootstrap_servers(self) -> list[str]:
        return self.kafka_bootstrap.split(",")

    def kafka_client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments common to AIOKafkaProducer and AIOKafkaConsumer."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers(),
            "client_id": self.kafka_client_id,
            "security_protocol": self.kafka_security_protocol,
            "request_timeout_ms": self.kafka_request_timeout_ms,
        }
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=self.kafka_ssl_cafile, certfile=self.kafka_ssl_certfile, keyfile=self.kafka_ssl_keyfile)
        if self.kafka_security_protocol.startswith("SASL_"):
            assert self.kafka_sasl_password is not None
            kwargs.update(sasl_mechanism=self.kafka_sasl_mechanism, sasl_plain_username=self.kafka_sasl_username,
                          sasl_plain_password=self.kafka_sasl_password.get_secret_value())
        return kwargs
