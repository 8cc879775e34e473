"""The event contract (docs/events/asyncapi.yaml) as the tests read it: each type's payload schema and the
header schema, with the document's `#/components/...` references resolved inside the document."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml
from jsonschema import Draft7Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7
from tests_paths import REPO

CONTRACT = REPO / "docs" / "events" / "asyncapi.yaml"
_BASE = "urn:agentrt-events-contract"


@dataclass(frozen=True)
class Contract:
    document: dict[str, Any]
    registry: Registry

    def validator(self, pointer: str) -> Draft7Validator:
        """A validator of the schema at `pointer` (e.g. #/components/schemas/Audit)."""
        return Draft7Validator({"$ref": f"{_BASE}{pointer}"}, registry=self.registry,
                               format_checker=FormatChecker())

    def messages(self) -> dict[str, dict[str, Any]]:
        """Event type (the message's name) -> its message object."""
        return {message["name"]: message for message in self.document["components"]["messages"].values()}

    def payload_validator(self, event_type: str) -> Draft7Validator:
        return self.validator(self.messages()[event_type]["payload"]["$ref"])

    def header_schema(self) -> dict[str, Any]:
        return self.document["components"]["schemas"]["CloudEventHeaders"]  # type: ignore[no-any-return]


@cache
def contract() -> Contract:
    document = yaml.safe_load(CONTRACT.read_text())
    resource = Resource.from_contents(document, default_specification=DRAFT7)
    return Contract(document, Registry().with_resource(_BASE, resource))
