"""What a timed run costs beside its speed: CPU of the library's process and of the
server's backends, and transaction ids taken, per job.

A rate alone hides how it was bought (an idle worker once looked fast because it spun
hundreds of commits a second), so the enqueue and drain rows of every library, the
raw-SQL floor included, get cost rows measured the same way over the same interval:

- **library CPU**: run time of every thread of the process that runs the library (the
  peer's runner, pgwork's worker or enqueuer process), from ``/proc/PID/task/*/
  schedstat`` (nanoseconds; ``/proc/PID/stat`` counts 10 ms ticks, too coarse for a
  half-second drain);
- **server CPU**: run time of the server's backends serving the run's database (a
  backend's title names its database), from ``/proc/PID/schedstat``; only when the
  server runs on this machine (else n/a). A backend that ended inside the interval is
  not counted; one that began is counted from zero;
- **transaction ids taken**: ids the server handed out over the interval
  (``pg_snapshot_xmax`` of a fresh snapshot, which takes none itself). A transaction
  that wrote takes one, and so does each savepoint that wrote inside it (an atomic
  group's member); a read-only poll takes none. So for a plain queue it counts the
  commits that wrote. It is counted server-wide, so it is this library's only while
  nothing else writes on the server (the benchmark runs one thing at a time;
  autovacuum is recorded with the run);
- **WAL per job**: bytes of write-ahead log the server wrote over the interval
  (``pg_current_wal_insert_lsn``), server-wide like the ids: what the library's rows,
  index entries and commits cost the disk, and the one figure here that does not move
  with the machine's load (full-page images after a checkpoint do add to it).

The interval opens when the harness reads the child's first mark (its first handler
start, or the start of its enqueuing loop) and closes when the run is over (the
database drained, or the loop done): the few milliseconds between the child's mark and
the harness's reading are left out of the CPU but not of the job count, a percent or
two at these sizes; the same for every library.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench._report import Cost

__all__ = ["CostMeter", "backends_cpu", "process_cpu"]

# The next transaction id (reading it takes none) and the WAL written so far, in bytes.
_COUNTERS = (
    "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
    " (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint"
)


def process_cpu(pid: int) -> float | None:
    """CPU seconds every thread of process ``pid`` ran so far (None once it is gone)."""
    total = 0
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            with open(f"{task.path}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
    except OSError:
        return None
    return total / 1e9


def backends_cpu(database: str) -> dict[int, float]:
    """CPU seconds of each server process serving ``database``, from /proc; empty when
    the server runs elsewhere."""
    out: dict[int, float] = {}
    marker = f" {database} ".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                title = f.read()
            if not title.startswith(b"postgres: ") or marker not in title:
                continue
            with open(f"/proc/{entry.name}/schedstat", "rb") as f:
                out[int(entry.name)] = int(f.read().split()[0]) / 1e9
        except OSError:
            continue
    return out


def _run_time(pid: int) -> float | None:
    """CPU seconds of the single-threaded process ``pid`` (a backend), None once gone."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return None


# Seconds between readings of the processes, and readings between looks for new
# backends. A process that ends keeps its last reading: a backend closed as its run
# ends (a runner tears down right after its result) must not vanish from the sum, and
# only its last few milliseconds, idle by then, go unread. Reading a few known files
# every 10 ms costs the harness well under 1 % of a core; a look through /proc ~1 ms.
_POLL = 0.01
_RESCAN = 25


class CostMeter:
    """Reads what a run costs between ``open()`` and ``close()``: the process ``pid``
    (the library's) and the backends of ``dsn``'s database; ``admin_dsn`` (another
    database of the same server) counts transaction ids."""

    def __init__(self, pid: int, dsn: str, admin_dsn: str) -> None:
        self.pid = pid
        self.database = str(conninfo_to_dict(dsn).get("dbname", ""))
        self.admin_dsn = admin_dsn
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._opened = self._closed = False
        # Readings: at the start, and the latest of each process.
        self._library: list[float] = []
        self._server_start: dict[int, float] = {}
        self._server: dict[int, float] = {}
        self._counters: list[tuple[int, int]] = []

    async def connect(self) -> None:
        """Open the connection the readings use, ahead of the run (connecting at the
        mark would take milliseconds out of the interval)."""
        if self._conn is None:
            self._conn = await psycopg.AsyncConnection.connect(self.admin_dsn, autocommit=True)

    async def _read_counters(self) -> tuple[int, int] | None:
        """The next transaction id and the WAL position."""
        await self.connect()
        assert self._conn is not None
        row = await (await self._conn.execute(_COUNTERS)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def _sample(self, *, rescan: bool) -> None:
        library = process_cpu(self.pid)
        if library is not None:
            self._library[1:] = [library]
        if rescan:
            self._server.update(backends_cpu(self.database))
            return
        for pid in self._server:
            cpu = _run_time(pid)
            if cpu is not None:
                self._server[pid] = cpu

    async def _poll(self) -> None:
        turn = 0
        while True:
            await asyncio.sleep(_POLL)
            turn += 1
            self._sample(rescan=turn % _RESCAN == 0)

    async def open(self) -> None:
        """The timed interval starts (the first time only: later marks change nothing)."""
        if self._opened:
            return
        self._opened = True
        library = process_cpu(self.pid)
        counters = await self._read_counters()
        if library is None or counters is None:
            return
        self._library = [library]
        self._server_start = backends_cpu(self.database)
        self._server = dict(self._server_start)
        self._counters = [counters]
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        """The timed interval is over."""
        if self._opened and not self._closed:
            self._closed = True
            if self._poller is not None:
                self._poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._poller
                self._sample(rescan=True)
                counters = await self._read_counters()
                if counters is not None:
                    self._counters.append(counters)
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    def per_job(self, jobs: int) -> Cost | None:
        """What each of ``jobs`` cost (None when the interval was not read whole)."""
        if len(self._counters) != 2 or not self._library or jobs <= 0:
            return None
        server = None
        if self._server:  # (none seen: the server runs elsewhere)
            spent = sum(cpu - self._server_start.get(pid, 0.0) for pid, cpu in self._server.items())
            server = spent / jobs * 1e6
        return Cost(
            library_us=(self._library[-1] - self._library[0]) / jobs * 1e6,
            server_us=server,
            writes=(self._counters[1][0] - self._counters[0][0]) / jobs,
            wal_bytes=(self._counters[1][1] - self._counters[0][1]) / jobs,
        )
