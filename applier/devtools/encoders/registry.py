"""Test fixture: an in-memory Confluent Schema Registry.

:class:`InMemoryRegistry` answers ``register``, ``schema_by_id``, ``latest_version`` and ``subjects`` like
:class:`applier.codecs.registry.RegistryClient` does, with Confluent's id semantics, so the avro decoder and
:class:`applier.devtools.encoders.avro.AvroEncoder` can be unit-tested without a server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from applier.codecs.registry import RegisteredSchema, SchemaNotFound, SubjectVersion

__all__ = ["InMemoryRegistry"]


@dataclass
class InMemoryRegistry:
    """Confluent registry semantics without a server: the same schema text gets the same id under every
    subject; a new text gets the next id; each subject keeps its versions. Not a stand-in for the real
    service in end-to-end tests (``applier.devtools.services`` runs Apicurio Registry for those)."""

    url: str = "memory://registry"
    _schemas: dict[int, RegisteredSchema] = field(default_factory=dict)
    _ids: dict[tuple[str, str], int] = field(default_factory=dict)
    _subjects: dict[str, list[int]] = field(default_factory=dict)
    lookups: int = 0

    def register(self, subject: str, schema: str | Mapping[str, Any], schema_type: str = "AVRO") -> int:
        text = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"))
        key = (schema_type.upper(), _canonical(text))
        schema_id = self._ids.get(key)
        if schema_id is None:
            schema_id = len(self._schemas) + 1
            self._ids[key] = schema_id
            self._schemas[schema_id] = RegisteredSchema(schema_id, text, schema_type.upper())
        versions = self._subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        self.lookups += 1
        try:
            return self._schemas[int(schema_id)]
        except KeyError:
            raise SchemaNotFound(
                f"schema registry {self.url} has no schema id {schema_id} (HTTP 404 error_code 40403)",
                url=self.url, status=404, error_code=40403,
            ) from None

    def latest_version(self, subject: str) -> SubjectVersion:
        versions = self._subjects.get(subject)
        if not versions:
            raise SchemaNotFound(
                f"schema registry {self.url} has no subject {subject!r} (HTTP 404 error_code 40401)",
                url=self.url, status=404, error_code=40401,
            )
        s = self._schemas[versions[-1]]
        return SubjectVersion(subject, len(versions), s.id, s.schema, s.schema_type)

    def subjects(self) -> list[str]:
        return sorted(self._subjects)


def _canonical(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text
