"""Connections and versioned migrations.

Migrations are the numbered ``*.sql`` files in ``services/store/migrations``. ``medic db migrate``
applies the ones not yet recorded in ``schema_migrations``, each in its own transaction, under an
advisory lock so two processes migrating at once cannot interleave. Running it again does nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector

from services.core.errors import InfraNotReady, MigrationError
from services.core.settings import Settings
from services.store.embedded import database_url

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# Any constant works; it only has to be the same in every process that migrates.
_MIGRATION_LOCK_ID = 0x436C4D6564  # "ClMed"


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str


def connect(settings: Settings, *, autocommit: bool = False) -> psycopg.Connection:
    """Open a connection, with the pgvector type registered once the extension exists.

    Raises:
        InfraNotReady: the server is not reachable.
    """
    url = database_url(settings)
    try:
        conn = psycopg.connect(url, autocommit=autocommit)
    except psycopg.OperationalError as exc:
        raise InfraNotReady(f"cannot connect to PostgreSQL: {exc}") from exc
    # before the first migration the extension (and so the type) may not exist yet
    row = conn.execute("SELECT to_regtype('vector') IS NOT NULL").fetchone()
    if row and row[0]:
        register_vector(conn)
    if not autocommit:
        conn.commit()
    return conn


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Read the migration files in version order.

    Raises:
        MigrationError: a file is misnamed or two share a version.
    """
    migrations: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration {path.name} must be named NNNN_snake_case.sql")
        version = int(match.group(1))
        if version in migrations:
            raise MigrationError(f"migrations {migrations[version].name} and {path.name} share version {version}")
        migrations[version] = Migration(version, path.name, path.read_text())
    return [migrations[v] for v in sorted(migrations)]


def applied_versions(conn: psycopg.Connection) -> set[int]:
    """Versions already recorded in ``schema_migrations`` (empty before the first migrate)."""
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return set()
    return {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}


def migrate(settings: Settings, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations and return the names of those applied now (empty when up to date)."""
    migrations = load_migrations(directory)
    applied_now: list[str] = []
    with connect(settings, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK_ID,))
        try:
            done = applied_versions(conn)
            for migration in migrations:
                if migration.version in done:
                    continue
                try:
                    with conn.transaction():
                        conn.execute(migration.sql.encode())
                        conn.execute(
                            "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                            (migration.version, migration.name),
                        )
                except psycopg.Error as exc:
                    raise MigrationError(f"{migration.name}: {exc}") from exc
                applied_now.append(migration.name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK_ID,))
    return applied_now
