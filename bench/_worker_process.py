"""pgwork in a process of its own, steered over stdin/stdout: a worker, or an enqueuer.

Used where the process boundary is the point: draining with two worker processes;
reading a worker's resident memory or CPU time without the benchmark's own in it; and,
when peers run (each in a process of its own), pgwork's enqueue and drain rows, so
that no library is measured inside the harness while the others are not.

Worker protocol: the child prints JSON lines. ``{"event": "ready", "loop": ...}`` once
its client is open (``loop``: the event loop it runs on, the harness's); it starts the
worker on the line ``go``, prints ``{"event": "first"}`` as its first handler starts
(the enqueuer: as its loop starts), for the harness to start reading what the run
costs (bench/_cost.py), then prints ``{"event": "count", ...}``
every ``--report-every`` seconds (0: never, for an idle worker whose CPU is measured),
and at once when its handlers' count reaches ``--target`` (the harness then looks for
the drained queue right away, as the peers' runners do on their own last handler,
instead of up to a report interval later); on ``stop`` it stops the worker, prints
``{"event": "stopped", ...}`` and exits.

    python -m bench._worker_process --dsn DSN --type noop [--slots 10] [--poll-interval S]
        [--atomic-group N] [--target N] [--hold-ms MS] [--spans]

Without ``--slots`` and ``--poll-interval`` the worker has pgwork's defaults. With
``--hold-ms`` or ``--spans`` each handler holds its attempt ``--hold-ms`` milliseconds
and notes when it began and ended; ``--spans`` writes those spans into
``bench_spans`` as the worker stops (the flow bench's oracle, bench/_spans.py).
Enqueuer: ``--enqueue N --batch B`` (B 0: one job per transaction) enqueues N jobs on
``go``, printing ``{"event": "count", ...}`` as it goes and ``{"event": "enqueued",
"seconds": ...}`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg

from bench._acquires import AcquireCount
from bench._cost import CostMeter
from bench._loop import current, run
from bench._pgwork_app import NOTIFY_KINDS, Counter, enqueue_jobs, open_client
from bench._report import Cost
from bench._spans import Spans

__all__ = ["WorkerProcess"]

REPORT_EVERY = 0.1
REPO_ROOT = str(Path(__file__).resolve().parents[1])


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _go() -> bool:
    line: str = await anyio.to_thread.run_sync(sys.stdin.readline)
    return line.strip() == "go"


async def _child(args: argparse.Namespace) -> None:
    from pgwork import create_in_process_worker
    from pgwork.worker import tune_gc

    counter = Counter(
        target=args.target or 2**62,
        on_first=lambda: _say(event="first"),
        record_starts=args.record_starts,
    )
    options: dict[str, Any] = {}
    if args.slots is not None:
        options["max_slots"] = args.slots
    if args.poll_interval is not None:
        options["poll_interval"] = args.poll_interval
    if args.atomic_group != 1:
        options["atomic_group"] = args.atomic_group
    spans = Spans(counter, args.hold_ms / 1e3) if args.hold_ms or args.spans else None
    handler = counter.handler() if spans is None else spans.handler()
    async with open_client(args.dsn, pool_size=args.pool_size, notify=args.notify) as client:
        acquires = AcquireCount(client.state) if args.count_acquires else None
        extra: dict[str, Any] = {}

        def counts() -> dict[str, Any]:
            if acquires is not None:
                extra["acquires"] = acquires.calls
            return extra

        worker = create_in_process_worker(client=client, processors={args.type: handler}, **options)
        if not args.no_gc_tuning:
            tune_gc()  # as the `pgwork worker` program does once the application is loaded
        _say(event="ready", loop=current())
        if not await _go():
            return
        stop = await worker.start()

        async def report() -> None:
            while args.report_every > 0:
                _say(event="count", count=counter.count, first=counter.first, **counts())
                if counter.done.is_set():
                    await anyio.sleep(args.report_every)
                    continue
                with anyio.move_on_after(args.report_every):
                    await counter.done.wait()  # the target: say so now

        async with anyio.create_task_group() as tg:
            tg.start_soon(report)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            tg.cancel_scope.cancel()
        await stop()
        if spans is not None and args.spans:
            await spans.write(args.dsn)
        if args.record_starts:
            extra["starts"] = counter.starts
        _say(event="stopped", count=counter.count, first=counter.first, **counts())


async def _enqueuer(args: argparse.Namespace) -> None:
    async with (
        open_client(args.dsn, pool_size=2) as client,
        await psycopg.AsyncConnection.connect(args.dsn) as conn,
    ):
        _say(event="ready", loop=current())
        if not await _go():
            return
        _say(event="first")
        seconds = await enqueue_jobs(
            client, conn, args.enqueue, args.batch or None, lambda n: _say(event="count", count=n)
        )
    _say(event="enqueued", seconds=seconds)


class WorkerProcess:
    """Parent-side handle of one child process (a worker or an enqueuer)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.count = 0
        self.first: float | None = None
        self.seconds: float | None = None
        self.meter: CostMeter | None = None
        self.loop: str | None = None  # the event loop the child said it runs on
        self.acquires = 0  # with --count-acquires: the acquiring calls, as last reported
        self.starts: dict[int, float] = {}  # with --record-starts: job n -> handler start
        self._ready = asyncio.Event()
        self._stopped = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(
        cls,
        dsn: str,
        *,
        type_name: str = "noop",
        slots: int | None = 10,
        poll_interval: float | None = None,
        report_every: float = REPORT_EVERY,
        atomic_group: int = 1,
        target: int | None = None,
        hold_ms: float = 0.0,
        spans: bool = False,
        notify: str = "postgres",
        count_acquires: bool = False,
        record_starts: bool = False,
        pool_size: int = 10,
    ) -> WorkerProcess:
        """A worker process, ready (its client open); ``go()`` starts the worker.
        ``slots`` / ``poll_interval`` None: pgwork's defaults. ``target``: the count of
        handler starts it reports as soon as it is reached. ``hold_ms``: each handler
        holds its attempt that long; ``spans``: and the handlers' spans are written into
        ``bench_spans`` as the worker stops. ``notify``: the transport it listens on
        (``make_notify``); ``count_acquires``: it reports its acquiring calls;
        ``record_starts``: it reports when each job's handler started."""
        args = ["--type", type_name, "--report-every", str(report_every)]
        args += ["--notify", notify, "--pool-size", str(pool_size)]
        if count_acquires:
            args.append("--count-acquires")
        if record_starts:
            args.append("--record-starts")
        if hold_ms:
            args += ["--hold-ms", str(hold_ms)]
        if spans:
            args.append("--spans")
        if target is not None:
            args += ["--target", str(target)]
        if slots is not None:
            args += ["--slots", str(slots)]
        if poll_interval is not None:
            args += ["--poll-interval", str(poll_interval)]
        if atomic_group != 1:
            args += ["--atomic-group", str(atomic_group)]
        return await cls._spawn(dsn, args)

    @classmethod
    async def enqueuer(cls, dsn: str, *, jobs: int, batch: int | None) -> WorkerProcess:
        """An enqueuing process, ready; ``go()`` starts it, ``finished()`` waits for it."""
        return await cls._spawn(dsn, ["--enqueue", str(jobs), "--batch", str(batch or 0)])

    @classmethod
    async def _spawn(cls, dsn: str, args: list[str]) -> WorkerProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench._worker_process",
            "--dsn",
            dsn,
            "--loop",
            current(),  # the harness's: pgwork runs on one loop throughout a run
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
        )
        handle = cls(proc)
        await asyncio.wait_for(handle._ready.wait(), timeout=60)
        if proc.returncode is not None or handle._stopped.is_set():
            raise RuntimeError(f"bench._worker_process {' '.join(args)} ended before it was ready")
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
                self.loop = event.get("loop")
                self._ready.set()
            elif kind == "first":
                if self.meter is not None:
                    await self.meter.open()
            elif kind in ("count", "stopped"):
                self.count = int(event["count"])
                self.first = event.get("first")
                self.acquires = int(event.get("acquires", self.acquires))
                starts = event.get("starts")
                if starts:
                    self.starts = {int(n): float(at) for n, at in starts.items()}
                if kind == "stopped":
                    self._stopped.set()
            elif kind == "enqueued":
                if self.meter is not None:
                    await self.meter.close()
                self.seconds = float(event["seconds"])
                self._stopped.set()
        self._ready.set()
        self._stopped.set()

    async def start_metering(self, dsn: str, admin_dsn: str) -> None:
        """Read what the run costs (this process and ``dsn``'s backends) from the
        child's first mark until ``cost``."""
        self.meter = CostMeter(self.proc.pid, dsn, admin_dsn)
        await self.meter.connect()

    async def cost(self, jobs: int) -> Cost | None:
        """The run is over: what each of its ``jobs`` cost (None when not metered)."""
        if self.meter is None:
            return None
        await self.meter.close()
        return self.meter.per_job(jobs)

    async def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def go(self) -> None:
        await self._send("go")

    async def finished(self, timeout: float) -> float:
        """Wait for an enqueuer to finish; return the seconds its enqueuing took."""
        await asyncio.wait_for(self._stopped.wait(), timeout=timeout)
        await asyncio.wait_for(self.proc.wait(), timeout=30)
        await self._reader
        if self.seconds is None:
            raise RuntimeError(f"the enqueuing process exited {self.proc.returncode}")
        return self.seconds

    async def stop(self) -> None:
        if self.meter is not None:
            await self.meter.close()
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
    parser.add_argument("--slots", type=int, default=None)
    parser.add_argument("--poll-interval", type=float, default=None)
    parser.add_argument("--atomic-group", type=int, default=1, help="the worker's atomic_group")
    parser.add_argument(
        "--no-gc-tuning",
        action="store_true",
        help="leave the garbage collector as it is (default: tune_gc, as `pgwork worker`)",
    )
    parser.add_argument("--report-every", type=float, default=REPORT_EVERY)
    parser.add_argument(
        "--target", type=int, default=None, help="report at once when this many handlers ran"
    )
    parser.add_argument(
        "--hold-ms", type=float, default=0.0, help="each handler holds its attempt this long"
    )
    parser.add_argument(
        "--spans", action="store_true", help="write the handlers' spans into bench_spans"
    )
    parser.add_argument("--enqueue", type=int, default=None, help="enqueue this many jobs")
    parser.add_argument("--notify", choices=NOTIFY_KINDS, default="postgres")
    parser.add_argument("--pool-size", type=int, default=10, help="the state adapter's pool")
    parser.add_argument(
        "--count-acquires", action="store_true", help="report the acquiring calls made"
    )
    parser.add_argument(
        "--record-starts", action="store_true", help="report when each handler started"
    )
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--batch", type=int, default=0)
    args = parser.parse_args()
    run(_enqueuer(args) if args.enqueue is not None else _child(args), args.loop)


if __name__ == "__main__":
    main()
