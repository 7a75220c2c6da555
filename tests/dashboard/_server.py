"""``pgwork dashboard`` as a user runs it: a subprocess serving on a free local port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def served(
    dsn: str,
    *args: str,
    env: dict[str, str] | None = None,
    output: list[str] | None = None,
) -> Iterator[str]:
    """Run ``pgwork dashboard`` on 127.0.0.1 and yield its base URL once it answers;
    what it printed is appended to ``output`` once it has stopped."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from pgwork.cli import main; main()",
            "dashboard",
            "--dsn",
            dsn,
            "--port",
            str(port),
            *args,
        ],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise AssertionError(f"pgwork dashboard exited: {process.stdout.read()}")  # type: ignore[union-attr]
            try:
                httpx.get(f"{url}/static/dashboard.css", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise AssertionError("pgwork dashboard did not start in 30 s") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if output is not None:
            output.append(process.stdout.read())  # type: ignore[union-attr]
