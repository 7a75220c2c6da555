"""Redis and NATS for the broker adapters' tests: the machine's servers, or private
ones a test may restart.

``redis_url()`` / ``nats_url()`` return the shared server's URL (``PGWORK_TEST_REDIS_URL``,
``PGWORK_TEST_NATS_URL``; by default this machine's 127.0.0.1:6379 and :4222) and skip
the test, saying why, when nothing answers there. ``private_redis`` / ``private_nats``
start a server of the test's own on a free loopback port, from the program on PATH
(skipping when it is missing), so that a test can stop and start it again: the shared
servers are never restarted. Each test names its channel or subject uniquely
(``unique_name``), so tests running side by side on one server never hear each other.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

__all__ = ["PrivateServer", "nats_url", "private_nats", "private_redis", "redis_url", "unique_name"]

REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}".replace(".-", ".")


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def redis_url() -> str:
    url = os.environ.get("PGWORK_TEST_REDIS_URL", REDIS_URL)
    if not _answers(url, 6379):
        pytest.skip(f"no Redis answers at {url} (set PGWORK_TEST_REDIS_URL)")
    return url


def nats_url() -> str:
    url = os.environ.get("PGWORK_TEST_NATS_URL", NATS_URL)
    if not _answers(url, 4222):
        pytest.skip(f"no NATS server answers at {url} (set PGWORK_TEST_NATS_URL)")
    return url


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrivateServer:
    """A broker process of the test's own on 127.0.0.1:``port``; ``stop`` and ``start``
    again keep the port, as a restarted server would."""

    def __init__(self, command: list[str], port: int, scheme: str) -> None:
        self.command = command
        self.port = port
        self.url = f"{scheme}://127.0.0.1:{port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        while not _answers(self.url, self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.command[0]} did not start on port {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _program(name: str, *also: str) -> str:
    found = shutil.which(name) or next((p for p in also if Path(p).exists()), None)
    if found is None:
        pytest.skip(f"{name} is not installed: the restart test needs a server of its own")
    return found


@contextlib.contextmanager
def private_redis() -> Iterator[PrivateServer]:
    program = _program("redis-server", "/usr/bin/redis-server")
    port = _free_port()
    server = PrivateServer(
        [program, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        port,
        "redis",
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def private_nats() -> Iterator[PrivateServer]:
    program = _program("nats-server", "/usr/sbin/nats-server")
    port = _free_port()
    store = tempfile.mkdtemp(prefix="pgwork-nats-")
    server = PrivateServer(
        [program, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store], port, "nats"
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(store, ignore_errors=True)
