"""Configuration: one pydantic-settings class per component.

Every setting is read from the environment (prefix AGENTRT_) and, when
AGENTRT_CONFIG_FILE names a YAML or TOML file, from that file; the
environment wins over the file. No business code reads os.environ.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

CONFIG_FILE_ENV = "AGENTRT_CONFIG_FILE"


class _FileSection(PydanticBaseSettingsSource):
    """Reads one section (e.g. `scheduler:`) of the config file, plus its top-level `common:` keys."""

    def __init__(self, settings_cls: type[BaseSettings], section: str) -> None:
        super().__init__(settings_cls)
        self._data: dict[str, Any] = {}
        path = os.environ.get(CONFIG_FILE_ENV)
        if not path:
            return
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"{CONFIG_FILE_ENV}={path}: no such file")
        source: PydanticBaseSettingsSource
        if file.suffix in {".yaml", ".yml"}:
            source = YamlConfigSettingsSource(settings_cls, yaml_file=file)
        elif file.suffix == ".toml":
            source = TomlConfigSettingsSource(settings_cls, toml_file=file)
        else:
            raise ValueError(f"{CONFIG_FILE_ENV}={path}: use a .yaml, .yml or .toml file")
        raw = source()
        data: dict[str, Any] = {}
        for part in ("common", section):
            value = raw.get(part) or {}
            if not isinstance(value, dict):
                raise ValueError(f"{path}: section {part!r} must be a mapping")
            data.update(value)
        self._data = {k: v for k, v in data.items() if k in settings_cls.model_fields}

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class ComponentSettings(BaseSettings):
    """Base: env prefix AGENTRT_, then the config file's section for this component."""

    model_config = SettingsConfigDict(env_prefix="AGENTRT_", extra="ignore")
    section: ClassVar[str] = "common"

    log_level: str = "INFO"
    # text (for a person at a terminal) | json (one object per line, for a log pipeline): shared/logs.py.
    log_format: Literal["text", "json"] = "text"
    # none | console | otlp; unset = OTEL_TRACES_EXPORTER, else none. Trace context is propagated
    # whatever the exporter; with none, nothing is sampled or recorded (the cheap default).
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    # OTLP collector; unset = OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT (read by
    # the exporter itself), else the exporter's default (localhost:4317 gRPC, localhost:4318 HTTP).
    otel_endpoint: str = ""
    # grpc | http/protobuf; unset = OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL, else grpc.
    otel_protocol: Literal["", "grpc", "http/protobuf"] = ""
    # Spans waiting for export; a span ending while the queue is full is dropped and counted.
    otel_max_queue_size: int = Field(2048, ge=1, le=1_000_000)
    # One export's deadline (retries included); unset = OTEL_EXPORTER_OTLP_TIMEOUT, else 10 s.
    otel_export_timeout_s: float | None = Field(None, gt=0, le=3_600, allow_inf_nan=False)
    # none | otlp: the Prometheus metrics also sent to the OTLP collector (shared/otlp_metrics.py);
    # unset = OTEL_METRICS_EXPORTER, else none. Prometheus scraping stays on either way.
    otel_metrics_exporter: Literal["none", "otlp"] = "none"
    service_name: str = "agentrt"
    # Prometheus /metrics on host:port; empty = off (the Helm chart sets 0.0.0.0:9464).
    metrics_addr: str = ""
    # auto (uvloop when installed) | asyncio | uvloop: see shared/event_loop.py.
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"

    @model_validator(mode="after")
    def _otel_exporter_from_environment(self) -> ComponentSettings:
        # OpenTelemetry's convention: OTEL_TRACES_EXPORTER applies unless agentrt's own setting is set.
        if "otel_exporter" not in self.model_fields_set:
            self.otel_exporter = _otel_traces_exporter(os.environ.get("OTEL_TRACES_EXPORTER", ""))
        if "otel_metrics_exporter" not in self.model_fields_set:
            names = {n.strip().lower() for n in os.environ.get("OTEL_METRICS_EXPORTER", "").split(",")}
            self.otel_metrics_exporter = "otlp" if "otlp" in names else "none"
        return self

    def metrics_protocol(self) -> str:
        protocol = (self.otel_protocol or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
        if protocol not in ("grpc", "http/protobuf"):
            raise ValueError(f"OTLP protocol {protocol!r}: agentrt exports grpc or http/protobuf")
        return protocol

    def tracing(self) -> TracingOptions:
        """What setup_tracing needs, with the OTEL_* variables agentrt (not the exporter) must read."""
        protocol = (self.otel_protocol or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
        if protocol not in ("grpc", "http/protobuf"):
            raise ValueError(f"OTLP protocol {protocol!r}: agentrt exports grpc or http/protobuf")
        return TracingOptions(
            service_name=self.service_name, service_name_set="service_name" in self.model_fields_set,
            exporter=self.otel_exporter, endpoint=self.otel_endpoint or None, protocol=protocol,
            export_timeout_s=self.otel_export_timeout_s, max_queue_size=self.otel_max_queue_size)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSection(settings_cls, cls.section), file_secret_settings)


@dataclass(frozen=True)
class TracingOptions:
    """A component's tracing settings, resolved (see ComponentSettings.tracing)."""

    service_name: str
    # An explicit agentrt service_name wins over OTEL_SERVICE_NAME; the component's default does not.
    service_name_set: bool = False
    exporter: str = "none"
    endpoint: str | None = None  # None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    protocol: str = "grpc"
    export_timeout_s: float | None = None
    max_queue_size: int = 2048


def _otel_traces_exporter(value: str) -> Literal["none", "console", "otlp"]:
    """OTEL_TRACES_EXPORTER (a comma-separated list in the spec) as one of agentrt's exporters."""
    names = {name.strip().lower() for name in value.split(",") if name.strip()}
    unknown = names - {"none", "console", "otlp"}
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER={value}: agentrt exports otlp or console (or none), "
                         f"not {', '.join(sorted(unknown))}")
    if "otlp" in names:
        return "otlp"
    return "console" if "console" in names else "none"
