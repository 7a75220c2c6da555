"""A pgwork worker in a process of its own, steered over stdin/stdout.

Used where the process boundary is the point: draining with two worker processes, and
reading a worker's resident memory without the benchmark's own in it.

Protocol: the child prints JSON lines. ``{"event": "ready"}`` once its client is open;
it starts the worker on the line ``go``, then prints ``{"event": "count", ...}`` every
100 ms; on ``stop`` it stops the worker, prints ``{"event": "stopped", ...}`` and exits.

    python -m bench._worker_process --dsn DSN --type noop --slots 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import anyio

from bench._pgwork_app import Counter, open_client

__all__ = ["WorkerProcess"]

REPORT_EVERY = 0.1
REPO_ROOT = str(Path(__file__).resolve().parents[1])


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _child(dsn: str, type_name: str, slots: int) -> None:
    from pgwork import create_in_process_worker

    counter = Counter(target=2**62)
    async with open_client(dsn) as client:
        worker = create_in_process_worker(
            client=client, processors={type_name: counter.handler()}, max_slots=slots
        )
        _say(event="ready")
        if (await anyio.to_thread.run_sync(sys.stdin.readline)).strip() != "go":
            return
        stop = await worker.start()

        async def report() -> None:
            while True:
                _say(event="count", count=counter.count, first=counter.first)
                await anyio.sleep(REPORT_EVERY)

        async with anyio.create_task_group() as tg:
            tg.start_soon(report)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            tg.cancel_scope.cancel()
        await stop()
        _say(event="stopped", count=counter.count, first=counter.first)


class WorkerProcess:
    """Parent-side handle of one child worker process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.count = 0
        self.first: float | None = None
        self._ready = asyncio.Event()
        self._stopped = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, dsn: str, *, type_name: str = "noop", slots: int = 10) -> WorkerProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench._worker_process",
            "--dsn",
            dsn,
            "--type",
            type_name,
            "--slots",
            str(slots),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
        )
        handle = cls(proc)
        await asyncio.wait_for(handle._ready.wait(), timeout=60)
        return handle

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "ready":
                self._ready.set()
            elif kind in ("count", "stopped"):
                self.count = int(event["count"])
                self.first = event.get("first")
                if kind == "stopped":
                    self._stopped.set()
        self._ready.set()
        self._stopped.set()

    async def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def go(self) -> None:
        await self._send("go")

    async def stop(self) -> None:
        if self.proc.returncode is None:
            await self._send("stop")
            try:
                await asyncio.wait_for(self._stopped.wait(), timeout=60)
                await asyncio.wait_for(self.proc.wait(), timeout=30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self._reader

    def rss_mib(self) -> float:
        """Resident set size of the child now, from /proc (Linux)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._worker_process")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--type", default="noop")
    parser.add_argument("--slots", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(_child(args.dsn, args.type, args.slots))


if __name__ == "__main__":
    main()
