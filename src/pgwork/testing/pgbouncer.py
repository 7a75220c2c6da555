"""A private PgBouncer in front of a test server, to test pgwork through a pooler.

``pgbouncer(server_dsn)`` writes its own ini and userlist into a temporary directory,
starts the ``pgbouncer`` binary on a free port of 127.0.0.1 (transaction pooling by
default, the mode of most hosted poolers), waits until it answers, and stops it when
the context exits. Every database of the server is reachable through it: turn a
server DSN into the pooler's with ``PgBouncer.dsn_for``.

``PgBouncerUnavailable`` (its message starts with ``pgbouncer unavailable:``) says why
one cannot be started here, so a test can skip with that reason.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgwork.postgres.connect import connect_sync

__all__ = ["PgBouncer", "PgBouncerUnavailable", "find_pgbouncer", "pgbouncer"]

# Debian and Ubuntu install it outside a normal user's PATH.
_SEARCHED = ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/bin/pgbouncer")
_VERSION = re.compile(r"PgBouncer (\d+)\.(\d+)")
# PgBouncer 1.21 tracks prepared statements itself (max_prepared_statements > 0); 0
# keeps the protocol-level passthrough that hosted poolers without it have.
_TRACKS_PREPARED_FROM = (1, 21)
_STARTUP_TIMEOUT = 10.0


class PgBouncerUnavailable(Exception):
    """PgBouncer cannot be started here; the message says why (``pgbouncer unavailable:``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"pgbouncer unavailable: {reason}")


@dataclass(frozen=True, slots=True)
class PgBouncer:
    """A running PgBouncer: where it listens and in which pool mode."""

    host: str
    port: int
    pool_mode: str
    version: tuple[int, int]
    directory: Path

    def dsn_for(self, server_dsn: str) -> str:
        """``server_dsn`` (any database of the server behind it) through this pooler."""
        params = conninfo_to_dict(server_dsn)
        params.update(host=self.host, port=str(self.port))
        params.pop("hostaddr", None)
        return make_conninfo("", **params)

    def log(self) -> str:
        """What PgBouncer logged so far (for a failing test's message)."""
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def find_pgbouncer() -> tuple[str, tuple[int, int]]:
    """The ``pgbouncer`` binary and its version; raise ``PgBouncerUnavailable`` if none."""
    found = shutil.which("pgbouncer") or next(
        (path for path in _SEARCHED if os.access(path, os.X_OK)), None
    )
    if found is None:
        raise PgBouncerUnavailable(
            "no pgbouncer binary on PATH or in /usr/sbin (apt-get install pgbouncer)"
        )
    out = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
    match = _VERSION.search(out.stdout + out.stderr)
    if match is None:
        raise PgBouncerUnavailable(f"cannot read the version of {found}: {out.stdout!r}")
    return found, (int(match.group(1)), int(match.group(2)))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run_as() -> list[str]:
    """PgBouncer refuses to run as root: as root, it drops to the ``postgres`` user."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PgBouncerUnavailable(
            "running as root and there is no 'postgres' user for pgbouncer to run as"
        ) from None
    return ["-u", "postgres"]


def _write_config(
    directory: Path,
    server_dsn: str,
    port: int,
    pool_mode: str,
    pool_size: int,
    version: tuple[int, int],
) -> Path:
    server = conninfo_to_dict(server_dsn)
    user = str(server.get("user") or "postgres")
    target = {"host": server.get("host") or "127.0.0.1", "port": server.get("port") or "5432"}
    if server.get("password"):
        target["password"] = str(server["password"])
    entry = " ".join(f"{key}={value}" for key, value in target.items())
    settings = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": str(directory),
        "auth_type": "trust",
        "auth_file": str(directory / "userlist.txt"),
        "pool_mode": pool_mode,
        "default_pool_size": str(pool_size),
        "max_client_conn": "500",
        "logfile": str(directory / "pgbouncer.log"),
        "pidfile": str(directory / "pgbouncer.pid"),
        "admin_users": user,
    }
    if version >= _TRACKS_PREPARED_FROM:
        settings["max_prepared_statements"] = "0"
    lines = ["[databases]", f"* = {entry}", "", "[pgbouncer]"]
    lines += [f"{key} = {value}" for key, value in settings.items()]
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    ini = directory / "pgbouncer.ini"
    ini.write_text("\n".join(lines) + "\n")
    return ini


def _wait_until_up(process: subprocess.Popen[bytes], bouncer: PgBouncer, dsn: str) -> None:
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    while True:
        if process.poll() is not None:
            raise PgBouncerUnavailable(f"it exited with {process.returncode}: {bouncer.log()}")
        try:
            with connect_sync(bouncer.dsn_for(dsn), autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling a process we started, not synchronising a test


def _let_reach_socket(server_dsn: str, run_as: list[str]) -> None:
    """A server on a unix socket in a private directory (the embedded test server's
    lives in its 0700 data directory): let the user PgBouncer drops to traverse the
    directories down to the socket (search permission only, nothing listed or read)."""
    host = str(conninfo_to_dict(server_dsn).get("host") or "")
    if not run_as or not host.startswith("/"):
        return
    for directory in (Path(host), *Path(host).parents):
        mode = directory.stat().st_mode
        if not mode & 0o001:
            directory.chmod(mode | 0o011)


@contextmanager
def pgbouncer(
    server_dsn: str, *, pool_mode: str = "transaction", pool_size: int = 20
) -> Iterator[PgBouncer]:
    """Run a PgBouncer in front of the server of ``server_dsn`` for the context's life.

    ``pool_size`` is its ``default_pool_size``: the server connections each database
    and user may use at once (1 makes every client share one server session)."""
    binary, version = find_pgbouncer()
    run_as = _run_as()
    _let_reach_socket(server_dsn, run_as)
    directory = Path(tempfile.mkdtemp(prefix="pgwork-pgbouncer-"))
    directory.chmod(0o777)  # the unprivileged user it drops to writes its log here
    port = _free_port()
    ini = _write_config(directory, server_dsn, port, pool_mode, pool_size, version)
    bouncer = PgBouncer("127.0.0.1", port, pool_mode, version, directory)
    process = subprocess.Popen(
        [binary, *run_as, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_until_up(process, bouncer, server_dsn)
        yield bouncer
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)
