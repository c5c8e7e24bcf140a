"""The one Settings object.

Every entrypoint (CLI command, Faust worker, Celery worker, test fixture) builds one :class:`Settings`
and passes it down; nothing reads the environment at import time. Each field is documented here and in
docs/configuration.md; the environment variable is the field name upper-cased with the
``CLUSTERMEDIC_`` prefix (``kafka_port`` -> ``CLUSTERMEDIC_KAFKA_PORT``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Runtime configuration, read from ``CLUSTERMEDIC_*`` environment variables (and ``.env``)."""

    model_config = SettingsConfigDict(env_prefix="CLUSTERMEDIC_", env_file=".env", extra="ignore")

    state_dir: Path = Field(
        default=Path(".run"),
        description="Where the local infrastructure keeps data, logs and PID files (relative to the cwd).",
    )
    cache_dir: Path = Field(
        default=Path.home() / ".cache" / "clustermedic",
        description="Downloads reused across clones and runs (the Kafka broker jars).",
    )

    # Kafka
    kafka_bootstrap: str | None = Field(
        default=None,
        description="Kafka bootstrap servers 'host:port[,host:port]'. Unset: the local broker on kafka_port.",
    )
    kafka_port: int = Field(default=19092, description="Port of the local Kafka broker (infra/local).")
    kafka_controller_port: int = Field(default=19093, description="KRaft controller port of the local broker.")
    kafka_version: str = Field(default="4.1.1", description="Apache Kafka version resolved from Maven Central.")
    kafka_partitions: int = Field(
        default=4, ge=1, description="Partition count of every topic (Faust needs one count across a pipeline)."
    )
    topic_prefix: str = Field(
        default="", description="Prefix added to every topic name; tests use it to get fresh topics."
    )

    # PostgreSQL
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL (with pgvector). Unset: the embedded server under state_dir/pgdata.",
    )

    # Redis / Celery
    redis_url: str | None = Field(
        default=None, description="Redis URL for Celery. Unset: the local redis-server on redis_port."
    )
    redis_port: int = Field(default=16379, description="Port of the local redis-server (infra/local).")

    # Faust
    faust_app_id: str = Field(default="clustermedic", description="Faust application id (consumer group).")
    faust_web_port: int = Field(default=16066, description="Port of the Faust worker's web server.")

    log_level: str = Field(default="INFO", description="Log level of every ClusterMedic process.")

    @property
    def bootstrap_servers(self) -> str:
        """The Kafka bootstrap servers to connect to."""
        return self.kafka_bootstrap or f"127.0.0.1:{self.kafka_port}"

    @property
    def broker_url(self) -> str:
        """The Redis URL used as Celery broker and result backend."""
        return self.redis_url or f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def run_dir(self) -> Path:
        """Absolute state directory."""
        return self.state_dir.expanduser().resolve()

    @property
    def pgdata(self) -> Path:
        """Data directory of the embedded PostgreSQL server."""
        return self.run_dir / "pgdata"

    def topic(self, name: str) -> str:
        """Return the full Kafka topic name for a base name such as ``telemetry.metrics.v1``."""
        return f"{self.topic_prefix}{name}"
