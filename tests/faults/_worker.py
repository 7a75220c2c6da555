"""A worker process for the fault scenarios: ``python -m tests.faults._worker DSN ...``.

Runs the handlers of ``tests.faults._jobs`` in one in-process worker and prints one
line per event, flushed, so the test can follow it from outside:

``started <job_id> <attempt>``   a handler began (after its ledger row was written)
``aborted <job_id> <reason>``    a handler was cancelled (lease lost, stop, timeout)
``event <name> <json fields>``   a pgwork event (``worker.started``, ``lease.lost``, ...)
``log <LEVEL> <logger> <text>``  a pgwork log record (WARNING and up)
``exited <error>``               the worker stopped on its own (it should not)
``stopped``                      the worker stopped after SIGTERM

Signal handling lives here, not in the library: SIGTERM calls ``worker.stop()``, whose
grace period (``--grace``) is kept short so in-flight jobs are released at once.

``PGWORK_FAULTS_BROKEN`` (read only by this driver) swaps some of the adapter's SQL for
deliberately broken statements before the adapter is built, so the tests can show each
oracle catches the failure it is meant to catch:

``unfenced``    every complete statement, renew and fail ignore the lease token (a
                completion matches its job by id alone, whatever its status); an
                atomic attempt checks no token as it begins
``no-reap``     expired leases (and dead workers' jobs) are never taken back
``eager-reap``  leases are taken back long before they expire
``no-notify``   the worker's listener never hears a ``ready`` notice (it must then
                find work by polling alone)
``no-release``  a stopping worker's hand-back (``release``) does nothing: its jobs
                stay leased to it until their leases expire
``spin``        an acquire that comes back short does not stop the worker from
                acquiring again at once (the idle busy-loop of an earlier build)
``early-commit`` a grouped atomic attempt's writes commit on their own, before its
                completion (which then commits with its group)
``unrenewed-atomic`` the worker renews no atomic attempt's lease while its handler
                runs (a fault rather than a broken build: it lets another worker reap
                a long atomic run that goes on, so the lease token's fence is what
                keeps its effect from committing twice)
``never-counting`` an attempt past the job's next-to-last is not counted: the attempt
                counter stops one short of ``max_attempts``, so no job ever fails
                for good (by its handler's errors or by a lost lease)
``no-reconnect`` once one of the state adapter's statements failed for a lost or
                silent connection, every later one fails too: a worker that never
                recovers from a database outage, restart or hang
``no-timeout``  a handler past its timeout is never stopped (nor given up on)
``no-dead-reclaim`` workers whose heartbeat went silent are never found dead: their
                jobs come back only as their leases expire
``racy-limits`` a limited acquire takes no lock on its types before it counts what
                runs: check-then-acquire, two acquires at once each fill the same room
``sync-commit-apart`` a sync atomic handler's ``attempt.connection.commit()`` commits
                the job's transaction there and then, its completion still to come
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from tests._loop import run as run_on_test_loop
from tests.faults._fleet import BROKEN_ENV
from tests.faults._jobs import Spec, registry

from pgwork import (
    Attempt,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    SyncAttempt,
    create_client,
    create_in_process_worker,
)
from pgwork.adapters.notify import Notice
from pgwork.errors import DatabaseTimeoutError
from pgwork.postgres._atomic_group import PgAtomicGroup
from pgwork.postgres._loan import _LentConnection
from pgwork.postgres.sql import leases, limits, outcomes
from pgwork.worker._slot import Slot, SlotState
from pgwork.worker._slots import Slots
from pgwork.worker._wakeups import Wakeups

# (statement, text that must be there, what replaces it): a missing text fails loudly,
# so a change to the real SQL cannot silently turn a broken build into a correct one.
_BREAKAGES: dict[str, list[tuple[str, str, str]]] = {
    "unfenced": [
        # Not even a job's final state fences a completion: in atomic mode a refused
        # completion rolls the handler's writes back, so a build that only dropped the
        # token check would still commit one effect per job.
        (
            "COMPLETE",
            "ELSE j.lease_token = c.token AND j.status = 'running' END",
            "ELSE true END",
        ),
        (
            "COMPLETE_ONE",
            "ELSE j.lease_token = c.token AND j.status = 'running' END",
            "ELSE true END",
        ),
        (
            "COMPLETE_ATOMIC",
            "ELSE j.lease_token = c.token AND j.status::text = 'running' END",
            "ELSE true END",
        ),
        (
            "COMPLETE_AND_ACQUIRE",
            "ELSE j.lease_token = c.token AND j.status = 'running' END",
            "ELSE true END",
        ),
        (
            "COMPLETE_AND_ACQUIRE_ANY_QUEUE",
            "ELSE j.lease_token = c.token AND j.status = 'running' END",
            "ELSE true END",
        ),
        ("RENEW", "j.id = r.id AND j.lease_token = r.token AND", "j.id = r.id AND"),
        ("RENEW", "ON u.id = r.id AND u.lease_token = r.token", "ON u.id = r.id"),
        ("FAIL", "j.id = f.id AND j.lease_token = f.token AND", "j.id = f.id AND"),
        (
            "BEGIN_ATOMIC",
            "AND j.lease_token = %(lease_token)s AND j.status::text = 'running'\n",
            "AND %(lease_token)s::uuid IS NOT NULL AND j.status = 'running'\n",
        ),
        (
            "BEGIN_ATOMIC_BOUNDED",
            "AND j.lease_token = %(lease_token)s AND j.status::text = 'running'\n",
            "AND %(lease_token)s::uuid IS NOT NULL AND j.status = 'running'\n",
        ),
    ],
    "eager-reap": [
        ("REAP", "j.leased_until < now()", "j.leased_until < now() + interval '1 hour'")
    ],
    "never-counting": [
        (
            constant,
            "attempt = j.attempt + 1,",
            "attempt = GREATEST(1, LEAST(j.attempt + 1, j.max_attempts - 1)),",
        )
        for constant in (
            "ACQUIRE",
            "ACQUIRE_ANY_QUEUE",
            "COMPLETE_AND_ACQUIRE",
            "COMPLETE_AND_ACQUIRE_ANY_QUEUE",
        )
    ],
    # The statement still runs (and still reads its parameter), it only locks nothing:
    # the acquire after it counts the running jobs of a snapshot that another acquire,
    # leasing the same room at the same moment, has not committed to yet.
    "racy-limits": [
        ("LOCK_TYPES", "pg_advisory_xact_lock({limit_lock}, hashtext(t.name))", "hashtext(t.name)")
    ],
}

# The state adapter's statements a worker runs; ``no-reconnect`` fails them all for
# good after the first that failed for its connection.
_WORKER_STATEMENTS = (
    "acquire",
    "complete_and_acquire",
    "complete",
    "complete_atomic",
    "begin_atomic",
    "fail",
    "renew",
    "reap",
    "release",
    "reschedule",
    "heartbeat",
    "register_worker",
    "find_dead_workers",
    "next_due",
)


def _never_reconnect() -> None:
    lost: list[BaseException] = []

    def wrap(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def broken(self: PostgresStateAdapter, *args: Any, **kwargs: Any) -> Any:
            if lost:
                raise psycopg.OperationalError(f"broken build: never reconnected ({lost[0]!r})")
            try:
                return await method(self, *args, **kwargs)
            except (psycopg.OperationalError, DatabaseTimeoutError) as exc:
                lost.append(exc)
                raise

        return broken

    for name in _WORKER_STATEMENTS:
        setattr(PostgresStateAdapter, name, wrap(getattr(PostgresStateAdapter, name)))


async def _commit_early(self: PgAtomicGroup, completion: Any, **next_steps: Any) -> Any:
    conn = self._conn
    await conn.execute(b"RELEASE SAVEPOINT pgwork_member; COMMIT; BEGIN; SAVEPOINT pgwork_member")
    return await _complete_in_group(self, completion, **next_steps)


_complete_in_group = PgAtomicGroup.complete


async def _never_reap(self: PostgresStateAdapter, **_: Any) -> list[Any]:
    return []


class _Deaf:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def wait(self, timeout: float) -> list[Notice]:
        return [n for n in await self._inner.wait(timeout) if n.kind != "ready"]


class _DeafNotifyAdapter(PostgresNotifyAdapter):
    @asynccontextmanager
    async def listen(self) -> AsyncIterator[Any]:
        async with super().listen() as listener:
            yield _Deaf(listener)


def notify_adapter(dsn: str, spec: str, **options: Any) -> PostgresNotifyAdapter:
    """The worker's notify adapter: deaf to ``ready`` notices in the ``no-notify`` build."""
    deaf = "no-notify" in (part.strip() for part in spec.split(","))
    return (_DeafNotifyAdapter if deaf else PostgresNotifyAdapter)(dsn, **options)


def _seconds(text: str) -> float | None:
    return None if text == "none" else float(text)


async def _no_dead_workers(self: PostgresStateAdapter, **_: Any) -> list[str]:
    return []


async def _never_release(self: PostgresStateAdapter, **_: Any) -> int:
    return 0


_lease_holders = Slots.lease_holders


def _staged_lease_holders(self: Slots) -> list[Any]:
    # Without the renewal of atomic attempts: a grouped one joining its group, or any
    # whose handler runs.
    return [
        s
        for s in _lease_holders(self)
        if s.staged or s.state not in (SlotState.JOINING, SlotState.RUNNING)
    ]


def break_statements(spec: str) -> None:
    """Patch the statement templates named by ``spec`` (comma-separated breakages);
    ``no-reap`` replaces the adapter's ``reap`` (expired leases and dead workers'),
    ``spin`` the worker's demand bookkeeping; ``no-notify`` is ``notify_adapter``'s."""
    for name in filter(None, (part.strip() for part in spec.split(","))):
        if name == "no-reap":
            PostgresStateAdapter.reap = _never_reap  # type: ignore[method-assign]
            continue
        if name == "no-release":
            PostgresStateAdapter.release = _never_release  # type: ignore[method-assign]
            continue
        if name == "spin":
            Wakeups.acquired = lambda self, *a, **k: None  # type: ignore[method-assign]
            continue
        if name == "no-notify":
            continue
        if name == "early-commit":
            PgAtomicGroup.complete = _commit_early  # type: ignore[method-assign]
            continue
        if name == "unrenewed-atomic":
            Slots.lease_holders = _staged_lease_holders  # type: ignore[method-assign]
            continue
        if name == "no-reconnect":
            _never_reconnect()
            continue
        if name == "no-timeout":
            Slot.timeout_deadline = lambda self: None  # type: ignore[method-assign]
            Slot.abandon_deadline = lambda self: None  # type: ignore[method-assign]
            continue
        if name == "sync-commit-apart":
            _LentConnection.commit = psycopg.Connection.commit  # type: ignore[method-assign]
            continue
        if name == "no-dead-reclaim":
            PostgresStateAdapter.find_dead_workers = _no_dead_workers  # type: ignore[method-assign]
            continue
        for constant, old, new in _BREAKAGES[name]:
            module = next(m for m in (leases, limits, outcomes) if hasattr(m, constant))
            template = getattr(module, constant)
            if old not in template:
                raise SystemExit(f"broken build {name!r}: {constant} no longer contains {old!r}")
            # Every occurrence: a statement that locks its rows first (SKIP LOCKED)
            # repeats its fence there.
            setattr(module, constant, template.replace(old, new))


class _Events:
    """Observer printing every worker event except the per-adapter-call ones."""

    def on_event(self, event: Any) -> None:
        if not event.name.startswith("adapter."):
            print(f"event {event.name} {json.dumps(dict(event.fields), default=str)}", flush=True)


class _Echo(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().replace("\n", " | ")
        print(f"log {record.levelname} {record.name} {text}", flush=True)


# How long a handler waits for a pooled ledger connection before it opens its own.
LEDGER_WAIT_S = 0.3
# A ledger write slower than this is reported (``ledger slow <job> <attempt> <s>``).
SLOW_LEDGER_S = 1.0


class Ledger:
    """Where handlers write their ledger rows: a pool, or a connection of the handler's
    own when the pool has none to give within ``LEDGER_WAIT_S``. After a fault that
    ended every connection of the process, the pool opens new ones with a backoff of
    seconds; a handler waiting for one could outlive its timeout, and the retry that
    follows would count as a run no fault explains. ``started`` lines say when a
    handler wrote its own way (``ledger own ...``)."""

    def __init__(self, pool: AsyncConnectionPool[Any], dsn: str) -> None:
        self.pool = pool
        self.dsn = dsn

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            conn = await self.pool.getconn(timeout=LEDGER_WAIT_S)
        except PoolTimeout:
            print("ledger own connection (the pool had none)", flush=True)
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as own:
                yield own
            return
        try:
            yield conn
        finally:
            await self.pool.putconn(conn)


Handler = Callable[[Attempt[Spec, Any]], Awaitable[Any]] | Callable[[SyncAttempt[Spec, Any]], Any]


def handlers(ledger: Ledger, reg: JobTypeRegistry) -> dict[str, Handler]:
    loop = asyncio.get_running_loop()

    async def record(attempt: Attempt[Spec, Any] | SyncAttempt[Spec, Any]) -> Spec:
        began = time.monotonic()
        async with ledger.connection() as conn:
            await conn.execute(
                "INSERT INTO faults_ledger (job_id, attempt, worker) VALUES (%s, %s, %s)",
                (attempt.job.id, attempt.job.attempt, attempt.worker_id),
            )
        took = time.monotonic() - began
        if took > SLOW_LEDGER_S:
            # The handler's own write, not the worker's: a timeout it causes is the
            # harness's, and this line says so beside the job.
            print(f"ledger slow {attempt.job.id} {attempt.job.attempt} {took:.2f}s", flush=True)
        print(f"started {attempt.job.id} {attempt.job.attempt}", flush=True)
        return attempt.job.input

    def duration(attempt: Attempt[Spec, Any] | SyncAttempt[Spec, Any]) -> float:
        spec = attempt.job.input
        slow = spec.first_ms is not None and attempt.job.attempt == 1
        if spec.slow_on is not None:
            slow = slow and spec.slow_on == attempt.worker_id
        ms = spec.first_ms if slow and spec.first_ms is not None else spec.ms
        return ms / 1000

    async def watched(attempt: Attempt[Spec, Any], body: Awaitable[Any]) -> Any:
        try:
            return await body
        except BaseException as exc:
            reason = attempt.abort_reason.value if attempt.abort_reason else type(exc).__name__
            print(f"aborted {attempt.job.id} {reason}", flush=True)
            raise

    async def work(attempt: Attempt[Spec, Any]) -> str:
        await record(attempt)
        await watched(attempt, asyncio.sleep(duration(attempt)))
        return attempt.worker_id

    async def effect(attempt: Attempt[Spec, Any]) -> str:
        await record(attempt)
        await attempt.connection.execute(
            "INSERT INTO faults_effects (job_id, worker) VALUES (%s, %s)",
            (attempt.job.id, attempt.worker_id),
        )
        await watched(attempt, asyncio.sleep(duration(attempt)))
        return attempt.worker_id

    def sync_effect(attempt: SyncAttempt[Spec, Any]) -> str:
        # ``effect`` as a plain def: its effect row written through the blocking
        # connection lent to its thread, kept (``commit``) before it sleeps, so a kill
        # mid-sleep finds it written but not committed (unless the build is broken).
        asyncio.run_coroutine_threadsafe(record(attempt), loop).result()
        db = attempt.connection
        db.execute(
            "INSERT INTO faults_effects (job_id, worker) VALUES (%s, %s)",
            (attempt.job.id, attempt.worker_id),
        )
        db.commit()
        if attempt.wait_cancelled(duration(attempt)):
            reason = attempt.cancel_reason
            print(f"aborted {attempt.job.id} {reason.value if reason else '?'}", flush=True)
            attempt.raise_if_cancelled("the sleep")
        return attempt.worker_id

    async def quiet(attempt: Attempt[Spec, Any]) -> str:
        await record(attempt)
        await watched(attempt, asyncio.sleep(duration(attempt)))
        return attempt.worker_id

    async def hang(attempt: Attempt[Spec, Any]) -> None:
        await record(attempt)
        await watched(attempt, asyncio.Event().wait())

    async def block(attempt: Attempt[Spec, Any]) -> str:
        await record(attempt)
        # Blocks the event loop on purpose: for the duration, or until the file exists.
        ends = time.monotonic() + duration(attempt)
        until = attempt.job.input.until if attempt.job.attempt == 1 else None
        if until is None:
            time.sleep(duration(attempt))  # noqa: ASYNC251
        while until is not None and not os.path.exists(until) and time.monotonic() < ends:
            time.sleep(0.02)  # noqa: ASYNC251
        return attempt.worker_id

    async def boom(attempt: Attempt[Spec, Any]) -> None:
        await record(attempt)
        raise RuntimeError(f"boom on attempt {attempt.job.attempt}")

    async def suicide(attempt: Attempt[Spec, Any]) -> None:
        await record(attempt)
        os.kill(os.getpid(), signal.SIGKILL)

    async def unwritable(attempt: Attempt[Spec, Any]) -> str:
        await record(attempt)
        # The common mistake: the error is swallowed, the transaction is lost.
        with contextlib.suppress(psycopg.errors.UniqueViolation):
            await attempt.connection.execute("INSERT INTO faults_unique VALUES (1)")
        return attempt.worker_id

    async def interval(attempt: Attempt[Spec, Any]) -> str:
        # The ledger row and the interval's start in one statement; the end is written
        # whatever ends the handler (a cancelled one too), unless its process dies. The
        # lease was set from the acquire's transaction start: less its length, that is
        # a moment no later than the acquire's.
        until = attempt.job.leased_until
        leased_at = None if until is None else until - attempt.job_type.lease
        async with ledger.connection() as conn:
            cur = await conn.execute(
                "WITH ledger AS (INSERT INTO faults_ledger (job_id, attempt, worker)"
                " VALUES (%(job)s, %(attempt)s, %(worker)s))"
                " INSERT INTO faults_intervals (job_id, attempt, limit_key, worker, leased_at)"
                " VALUES (%(job)s, %(attempt)s, %(key)s, %(worker)s, %(leased_at)s)"
                " RETURNING id",
                {
                    "job": attempt.job.id,
                    "attempt": attempt.job.attempt,
                    "key": attempt.limit_key,
                    "worker": attempt.worker_id,
                    "leased_at": leased_at,
                },
            )
            row = await cur.fetchone()
        assert row is not None
        print(f"started {attempt.job.id} {attempt.job.attempt}", flush=True)
        try:
            await watched(attempt, asyncio.sleep(duration(attempt)))
        finally:
            with anyio.CancelScope(shield=True):
                async with ledger.connection() as conn:
                    await conn.execute(
                        "UPDATE faults_intervals SET ended_at = clock_timestamp() WHERE id = %s",
                        (row[0],),
                    )
        return attempt.worker_id

    async def relay(attempt: Attempt[Spec, Any]) -> Continue[Spec]:
        await record(attempt)
        await attempt.connection.execute(
            "INSERT INTO faults_effects (job_id, worker) VALUES (%s, %s)",
            (attempt.job.id, attempt.worker_id),
        )
        await watched(attempt, asyncio.sleep(duration(attempt)))
        return Continue(reg.get("work"), Spec(n=attempt.job.input.n, ms=10))

    return {
        "work": work,
        "effect": effect,
        "sync_effect": sync_effect,
        "quiet": quiet,
        "hang": hang,
        "block": block,
        "boom": boom,
        "suicide": suicide,
        "unwritable": unwritable,
        "relay": relay,
        "limited": interval,
        "keyed": interval,
        "rated": interval,
    }


async def main(args: argparse.Namespace) -> int:
    break_statements(os.environ.get(BROKEN_ENV, ""))
    reg = registry(args.lease)
    # --defaults: the library's own sizing (create_in_process_worker's max_slots, the
    # adapter pool's min_size/max_size), never exercised otherwise; the ledger pool is
    # the test's, sized for the default slots.
    sizing: dict[str, Any] = {} if args.defaults else {"max_slots": args.slots}
    ledger: AsyncConnectionPool[Any] = AsyncConnectionPool(
        args.ledger_dsn or args.dsn,
        min_size=1,
        max_size=args.slots if not args.defaults else 10,
        kwargs={"autocommit": True},
        check=AsyncConnectionPool.check_connection,
        open=False,
    )
    await ledger.open()
    bounds: dict[str, Any] = {}
    if args.operation_timeout is not None:
        bounds["operation_timeout"] = _seconds(args.operation_timeout)
    state = await (
        PostgresStateAdapter.connect(args.dsn, **bounds)
        if args.defaults
        else PostgresStateAdapter.connect(args.dsn, max_size=args.slots + 4, **bounds)
    )
    checks: dict[str, Any] = {}
    if args.listener_check is not None:
        checks["check_interval"] = _seconds(args.listener_check)
    client = create_client(
        state_adapter=state,
        notify_adapter=notify_adapter(args.dsn, os.environ.get(BROKEN_ENV, ""), **checks),
        registry=reg,
    )
    all_handlers = handlers(Ledger(ledger, args.ledger_dsn or args.dsn), reg)
    liveness: dict[str, Any] = {}
    if args.heartbeat is not None:
        liveness["heartbeat_interval"] = args.heartbeat
    if args.dead_after is not None:
        liveness["dead_worker_after"] = args.dead_after
    worker = create_in_process_worker(
        client=client,
        processors={name: all_handlers[name] for name in args.types.split(",")},
        **sizing,
        worker_id=args.worker_id,
        poll_interval=args.poll,
        grace_period=args.grace,
        observers=[_Events()],
        atomic_group=args.atomic_group,
        atomic_group_wait=args.atomic_group_wait,
        **liveness,
    )
    terminate = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate.set)
    run = asyncio.create_task(worker.run())
    waiter = asyncio.create_task(terminate.wait())
    await asyncio.wait({run, waiter}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if terminate.is_set():
        await worker.stop()
        print("stopped", flush=True)
    else:
        waiter.cancel()
        error = run.exception() if not run.cancelled() else None
        print(f"exited {error!r}", flush=True)
        code = 3
    await client.close()
    await ledger.close()
    return code


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults._worker")
    parser.add_argument("dsn")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--types", default="work,effect,quiet")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--grace", type=float, default=0.2)
    parser.add_argument("--atomic-group", type=int, default=1)
    parser.add_argument("--atomic-group-wait", type=float, default=0.005)
    parser.add_argument(
        "--ledger-dsn",
        default=None,
        help="where the handlers write their ledger rows (default: DSN); the oracle's "
        "bookkeeping then bypasses a faulty path the worker is given",
    )
    parser.add_argument(
        "--operation-timeout",
        default=None,
        help="the state adapter's operation_timeout in seconds, or 'none' (default: the library's)",
    )
    parser.add_argument(
        "--listener-check",
        default=None,
        help="the notify adapter's check_interval in seconds, or 'none' (default: the library's)",
    )
    parser.add_argument("--heartbeat", type=float, default=None, help="heartbeat_interval (s)")
    parser.add_argument("--dead-after", type=float, default=None, help="dead_worker_after (s)")
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="leave max_slots and the adapter pool's size to the library's defaults",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.getLogger("pgwork").setLevel(logging.WARNING)
    logging.getLogger("pgwork").addHandler(_Echo())
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    sys.exit(run_on_test_loop(main, parse(sys.argv[1:])))
