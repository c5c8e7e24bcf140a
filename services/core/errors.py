"""ClusterMedic's exception hierarchy.

Every error the project raises on purpose derives from :class:`ClusterMedicError`, so callers can catch
one class at a boundary (a consumer loop, an HTTP handler, the CLI) and know the rest is a bug::

    ClusterMedicError
    ├── ConfigError            settings or a config file are wrong; fix and restart
    ├── InfraError             a real component (Kafka, Postgres, Redis) is unreachable or misbehaves
    │   └── InfraNotReady      it did not come up before the deadline
    ├── PluginError            a registry entry cannot be loaded or is not what it claims
    ├── EventError             a message cannot become an event
    │   ├── DecodeError        not UTF-8 / not JSON
    │   └── SchemaError        JSON, but not valid for the event model
    └── StoreError             a database operation failed
        └── MigrationError     a migration could not be applied
"""

from __future__ import annotations


class ClusterMedicError(Exception):
    """Root of every error ClusterMedic raises on purpose."""


class ConfigError(ClusterMedicError):
    """A setting or configuration file is invalid."""


class InfraError(ClusterMedicError):
    """A real infrastructure component is unreachable or failed."""


class InfraNotReady(InfraError):
    """A component did not become ready before its deadline."""


class PluginError(ClusterMedicError):
    """A plugin registry entry could not be loaded."""


class EventError(ClusterMedicError):
    """A message could not be turned into an event."""


class DecodeError(EventError):
    """The raw bytes are not UTF-8 JSON."""


class SchemaError(EventError):
    """The JSON does not validate against the event model."""


class StoreError(ClusterMedicError):
    """A database operation failed."""


class MigrationError(StoreError):
    """A schema migration could not be applied."""
