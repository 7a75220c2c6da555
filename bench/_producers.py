"""Producers in a process of their own, for ``python -m bench.notify``'s enqueue rows.

The child opens a client on the notify transport it is given and ``--connections``
connections, prints ``{"event": "ready"}``, and on the line ``go`` enqueues
``--jobs`` no-op jobs, one per transaction, spread over its connections (each its own
task); a Redis or NATS notice is published after the commit, inside
``notify_after_commit``. It then prints ``{"event": "enqueued", "seconds": ...,
"cpu": ...}`` (its CPU seconds while enqueuing) and keeps its connections open until
the next line, so that the harness can read the server's CPU before they go.

    python -m bench._producers --dsn DSN --notify redis --connections 8 --jobs 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg

from bench._loop import current, run
from bench._pgwork_app import NOTIFY_KINDS, Item, open_client

__all__ = ["ProducerProcess"]

BROKERS = ("redis", "nats")
REPO_ROOT = str(Path(__file__).resolve().parents[1])


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _produce(
    client: Any, conn: psycopg.AsyncConnection[Any], jobs: int, broker: bool
) -> None:
    from pgwork import notify_after_commit

    noop = client.registry.get("noop")
    for n in range(jobs):
        if broker:
            async with notify_after_commit():
                await client.start_chain(conn, noop, Item(n=n))
                await conn.commit()
        else:
            await client.start_chain(conn, noop, Item(n=n))
            await conn.commit()


async def _child(args: argparse.Namespace) -> None:
    async with open_client(args.dsn, pool_size=2, notify=args.notify) as client:
        conns = [await psycopg.AsyncConnection.connect(args.dsn) for _ in range(args.connections)]
        try:
            _say(event="ready", loop=current())
            line: str = await anyio.to_thread.run_sync(sys.stdin.readline)
            if line.strip() != "go":
                return
            shares = [args.jobs // len(conns)] * len(conns)
            shares[0] += args.jobs - sum(shares)
            cpu, started = time.process_time(), time.perf_counter()
            async with anyio.create_task_group() as tg:
                for conn, share in zip(conns, shares, strict=True):
                    tg.start_soon(_produce, client, conn, share, args.notify in BROKERS)
            _say(
                event="enqueued",
                seconds=time.perf_counter() - started,
                cpu=time.process_time() - cpu,
            )
            await anyio.to_thread.run_sync(sys.stdin.readline)
        finally:
            for conn in conns:
                await conn.close()


class ProducerProcess:
    """Parent-side handle of one producing process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, dsn: str, *, notify: str, connections: int, jobs: int) -> ProducerProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench._producers",
            "--dsn",
            dsn,
            "--loop",
            current(),
            "--notify",
            notify,
            "--connections",
            str(connections),
            "--jobs",
            str(jobs),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
        )
        handle = cls(proc)
        event = await asyncio.wait_for(handle._event(), timeout=120)
        if event.get("event") != "ready":
            raise RuntimeError(f"a producing process did not start: {event}")
        return handle

    async def _event(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            try:
                event: dict[str, Any] = json.loads(raw)
            except ValueError:
                continue
            return event
        return {"event": "exited", "code": await self.proc.wait()}

    async def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def go(self) -> None:
        await self._send("go")

    async def enqueued(self, timeout: float) -> tuple[float, float]:
        """Wait for the process to finish enqueuing: (seconds, CPU seconds)."""
        event = await asyncio.wait_for(self._event(), timeout=timeout)
        if event.get("event") != "enqueued":
            raise RuntimeError(f"a producing process failed: {event}")
        return float(event["seconds"]), float(event["cpu"])

    async def stop(self) -> None:
        if self.proc.returncode is None:
            try:
                await self._send("stop")
                await asyncio.wait_for(self.proc.wait(), timeout=30)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                self.proc.kill()
                await self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._producers")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--notify", choices=NOTIFY_KINDS, default="postgres")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    run(_child(args), args.loop)


if __name__ == "__main__":
    main()
