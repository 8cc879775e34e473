"""Configuration: one pydantic-settings class per component.

Every setting is read from the environment (prefix AGENTRT_) and, when
AGENTRT_CONFIG_FILE names a YAML or TOML file, from that file; the
environment wins over the file. No business code reads os.environ.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

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
    # none | console | memory (tests). Trace context is propagated whatever the exporter.
    otel_exporter: str = "none"
    service_name: str = "agentrt"
    # Prometheus /metrics on host:port; empty = off (the Helm chart sets 0.0.0.0:9464).
    metrics_addr: str = ""
    # auto (uvloop when installed) | asyncio | uvloop: see devstack/loop.py.
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"

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
