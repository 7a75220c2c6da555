"""Sync handlers of atomic job types: a plain ``def`` writes through a blocking
connection in the job's own transaction (``SyncAttempt.connection``).

What the user sees: psycopg code and SQLAlchemy's sync API write through it, and what
they wrote commits with the job's completion; a handler that raises, times out or is
given up on leaves nothing behind; ``commit`` and ``rollback`` act on the handler's
own part of the transaction, never on the job's; the connection is usable only while
the handler runs. A worker that groups atomic attempts, or whose store cannot lend a
transaction to a thread, refuses such a handler before any job runs. Each mechanism
has a control that takes it out.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool
from tests._core_only import CoreOnly

from pgwork import (
    AtomicSyncHandlerError,
    Attempt,
    Client,
    ConfigurationError,
    JobStatus,
    JobTypeRegistry,
    PostgresStateAdapter,
    RetryPolicy,
    StartedChain,
    SyncAttempt,
    create_in_process_worker,
)
from pgwork.adapters.capabilities import operations
from pgwork.adapters.state import AtomicAttempts

from ._run_one import RunOne
from .conftest import ClientFactory, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

NO_BACKOFF = RetryPolicy(initial=timedelta(0), maximum=timedelta(0))

EFFECTS = """
CREATE TABLE sync_effects (
    id serial PRIMARY KEY,
    job_id uuid NOT NULL,
    note text NOT NULL
)
"""


class Num(BaseModel):
    n: int


class Base(DeclarativeBase):
    pass


class Effect(Base):
    __tablename__ = "sync_effects"
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[UUID]
    note: Mapped[str]


@pytest.fixture
async def effects(pgwork_dsn: str) -> str:
    """The table the handlers write their effects to; returns the DSN to read it."""
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
        await c.execute(EFFECTS)
    return pgwork_dsn


async def _notes(dsn: str, job_id: UUID) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT note FROM sync_effects WHERE job_id = %s ORDER BY id", (job_id,)
        )
        return [row[0] for row in await cur.fetchall()]


def _write(attempt: SyncAttempt[Any, Any], note: str) -> None:
    attempt.connection.execute(
        "INSERT INTO sync_effects (job_id, note) VALUES (%s, %s)", (attempt.job.id, note)
    )


async def _status(client: Any, job_id: UUID) -> JobStatus:
    return (await client.get_job(job_id)).status


# --- committed with the completion ---------------------------------------------------


async def test_psycopg_writes_of_a_sync_atomic_handler_commit_with_its_completion(
    run_one: RunOne, effects: str
) -> None:
    reg = JobTypeRegistry()
    post = reg.job_type("post", input=Num, output=int, mode="atomic")
    seen: dict[str, Any] = {}

    def handler(attempt: SyncAttempt[Num, int]) -> int:
        db = attempt.connection
        seen["type"] = type(db)
        seen["thread"] = threading.current_thread().name
        _write(attempt, "execute")
        with db.cursor() as cur:
            cur.execute(
                "INSERT INTO sync_effects (job_id, note) VALUES (%s, %s) RETURNING id",
                (attempt.job.id, "cursor"),
            )
            seen["returned"] = cur.fetchone()
            # The job's own row, as the transaction sees it: still running, its lease ours.
            cur.execute("SELECT count(*) FROM sync_effects WHERE job_id = %s", (attempt.job.id,))
            seen["own_writes"] = cur.fetchone()
        return attempt.job.input.n

    ran = await run_one(
        reg,
        Num(n=5),
        until=JobStatus.COMPLETED,
        worker_id="w-sync-atomic",
        processors={post: handler},
    )
    assert (await ran.job()).output == 5
    assert await _notes(effects, ran.started.job_id) == ["execute", "cursor"]
    assert issubclass(seen["type"], psycopg.Connection)
    assert seen["thread"].startswith("pgwork-sync-w-sync-atomic-")
    assert seen["returned"] is not None
    assert seen["own_writes"] == (2,)


async def _status_is(client: Any, job_id: UUID, status: JobStatus) -> bool:
    return await _status(client, job_id) is status


async def test_a_sqlalchemy_session_over_the_connection_commits_with_the_job(
    run_one: RunOne, effects: str
) -> None:
    reg = JobTypeRegistry()
    post = reg.job_type("post", input=Num, mode="atomic", max_attempts=2, retry=NO_BACKOFF)

    def handler(attempt: SyncAttempt[Num, None]) -> None:
        # SQLAlchemy takes the attempt's connection as its DB-API connection.
        engine = create_engine(
            "postgresql+psycopg://", creator=lambda: attempt.connection, poolclass=NullPool
        )
        with Session(engine) as session:
            session.add(Effect(job_id=attempt.job.id, note="orm"))
            session.commit()
        with Session(engine) as session:
            session.add(Effect(job_id=attempt.job.id, note="never committed"))
            session.flush()
            # Left without commit: undone when the session closes, as on any connection.
        if attempt.job.attempt == 1:
            raise RuntimeError("the first attempt fails after its session committed")

    ran = await run_one(reg, Num(n=1), until=JobStatus.COMPLETED, processors={post: handler})
    job = await ran.job()
    assert job.attempt == 2
    # The first attempt's session commit was undone with its attempt: one row, not two.
    assert await _notes(effects, ran.started.job_id) == ["orm"]


async def test_commit_and_rollback_act_on_the_handlers_own_writes_only(
    run_one: RunOne, effects: str
) -> None:
    reg = JobTypeRegistry()
    post = reg.job_type("post", input=Num, mode="atomic", max_attempts=1)

    def handler(attempt: SyncAttempt[Num, None]) -> None:
        db = attempt.connection
        _write(attempt, "kept")
        db.commit()
        _write(attempt, "undone")
        db.rollback()
        try:
            _write(attempt, "before the error")
            db.execute("SELECT 1/0")  # the transaction is in error ...
        except psycopg.errors.DivisionByZero:
            db.rollback()  # ... and usable again, without what came before the error
        _write(attempt, "after the error")
        with db.transaction():  # psycopg's own blocks nest as savepoints
            _write(attempt, "in a block")

    ran = await run_one(reg, Num(n=1), until=JobStatus.COMPLETED, processors={post: handler})
    assert await _notes(effects, ran.started.job_id) == ["kept", "after the error", "in a block"]


# --- nothing left behind -------------------------------------------------------------


async def test_a_raising_sync_atomic_handler_leaves_none_of_its_writes(
    run_one: RunOne, effects: str
) -> None:
    reg = JobTypeRegistry()
    post = reg.job_type("post", input=Num, mode="atomic", max_attempts=2, retry=NO_BACKOFF)

    def handler(attempt: SyncAttempt[Num, None]) -> None:
        _write(attempt, f"attempt {attempt.job.attempt}")
        attempt.connection.commit()  # kept for the job: not committed on its own
        raise ValueError("the handler failed after writing")

    ran = await run_one(reg, Num(n=1), until=JobStatus.FAILED, processors={post: handler})
    job = await ran.job()
    assert job.attempt == 2
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.ValueError"
    assert await _notes(effects, ran.started.job_id) == []


async def test_a_timed_out_statement_is_cancelled_and_leaves_nothing(
    run_one: RunOne, effects: str
) -> None:
    """Control: without ``BlockingLoan.interrupt`` the statement runs its 30 s, the
    handler is abandoned instead of ending with the timeout, and this test fails."""
    reg = JobTypeRegistry()
    post = reg.job_type(
        "post",
        input=Num,
        mode="atomic",
        timeout=timedelta(milliseconds=300),
        abandon_after=timedelta(seconds=20),
        max_attempts=1,
    )
    raised: list[BaseException] = []

    def handler(attempt: SyncAttempt[Num, None]) -> None:
        _write(attempt, "before the sleep")
        try:
            attempt.connection.execute("SELECT pg_sleep(30)")
        except BaseException as exc:
            raised.append(exc)
            raise

    began = time.monotonic()
    ran = await run_one(reg, Num(n=1), until=JobStatus.FAILED, processors={post: handler})
    assert time.monotonic() - began < 10
    job = await ran.job()
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.TimeoutError"
    assert [type(exc) for exc in raised] == [psycopg.errors.QueryCanceled]
    assert ran.worker.abandoned_handlers == 0
    assert await _notes(effects, ran.started.job_id) == []


async def test_an_abandoned_handler_fails_cleanly_on_its_discarded_connection(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], effects: str
) -> None:
    reg = JobTypeRegistry()
    stuck_type = reg.job_type(
        "stuck",
        input=Num,
        mode="atomic",
        timeout=timedelta(milliseconds=200),
        abandon_after=timedelta(milliseconds=300),
        max_attempts=1,
    )
    after_type = reg.job_type("after", input=Num, mode="atomic")
    release = threading.Event()
    ended: list[BaseException | None] = []

    def stuck(attempt: SyncAttempt[Num, None]) -> None:
        _write(attempt, "before it hung")
        release.wait(30)  # deaf to the cancellation
        try:
            _write(attempt, "after it was given up on")
        except BaseException as exc:
            ended.append(exc)
            raise
        ended.append(None)

    def after(attempt: SyncAttempt[Num, None]) -> None:
        _write(attempt, "next")

    client = await make_client(reg)
    worker = await workers(
        client=client, processors={stuck_type: stuck, after_type: after}, max_slots=1
    )
    first = await client.start_chain(conn, stuck_type, Num(n=1))
    await conn.commit()
    await eventually(
        lambda: _status_is(client, first.job_id, JobStatus.FAILED), what="the stuck job failed"
    )
    job = await client.get_job(first.job_id)
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "pgwork.errors.HandlerAbandonedError"
    release.set()
    await eventually(lambda: _true(bool(ended)), what="the abandoned handler ended")
    assert isinstance(ended[0], psycopg.OperationalError)
    assert "gave up on this attempt" in str(ended[0])
    # The slot and the pool go on: the next atomic job runs and commits.
    second = await client.start_chain(conn, after_type, Num(n=2))
    await conn.commit()
    await eventually(
        lambda: _status_is(client, second.job_id, JobStatus.COMPLETED), what="the next job"
    )
    assert await _notes(effects, first.job_id) == []
    assert await _notes(effects, second.job_id) == ["next"]
    assert worker.abandoned_handlers == 0


async def _true(value: bool) -> bool:
    return value


async def test_the_connection_is_unusable_once_the_handler_returned(
    run_one: RunOne, effects: str
) -> None:
    reg = JobTypeRegistry()
    post = reg.job_type("post", input=Num, mode="atomic")
    kept: list[Any] = []

    def handler(attempt: SyncAttempt[Num, None]) -> None:
        kept.append(attempt.connection)
        _write(attempt, "inside")

    ran = await run_one(reg, Num(n=1), until=JobStatus.COMPLETED, processors={post: handler})
    with pytest.raises(psycopg.OperationalError, match="given back to the worker"):
        kept[0].execute(
            "INSERT INTO sync_effects (job_id, note) VALUES (%s, 'late')", (ran.started.job_id,)
        )
    assert await _notes(effects, ran.started.job_id) == ["inside"]


async def test_a_staged_sync_handler_has_no_connection(run_one: RunOne) -> None:
    reg = JobTypeRegistry()
    staged = reg.job_type("staged", input=Num, output=bool)

    def handler(attempt: SyncAttempt[Num, bool]) -> bool:
        return attempt.connection is None

    ran = await run_one(reg, Num(n=1), until=JobStatus.COMPLETED, processors={staged: handler})
    assert (await ran.job()).output is True


# --- refused -------------------------------------------------------------------------


class Refusal:
    """A ``ledger`` job (atomic) enqueued on ``client``, and a sync handler of its
    type that records each call; ``refused(**options)`` builds a worker with it,
    expects ``AtomicSyncHandlerError`` naming the type, and checks that no job ran."""

    def __init__(self, client: Client, ledger: Any, started: StartedChain[Any, Any]) -> None:
        self.client = client
        self.ledger = ledger
        self.started = started
        self.calls: list[int] = []

    def post(self, attempt: SyncAttempt[Num, None]) -> None:
        self.calls.append(attempt.job.input.n)

    @staticmethod
    async def post_async(attempt: Attempt[Num, None]) -> None:
        return None

    async def refused(self, **options: Any) -> AtomicSyncHandlerError:
        with pytest.raises(AtomicSyncHandlerError) as caught:
            create_in_process_worker(
                client=self.client, processors={self.ledger: self.post}, **options
            )
        assert isinstance(caught.value, ConfigurationError)
        assert caught.value.type_name == "ledger"
        assert "'ledger'" in str(caught.value)
        assert self.calls == []
        assert (await self.client.get_job(self.started.job_id)).attempt == 0
        return caught.value


async def _refusal(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], store: Any = None
) -> Refusal:
    reg = JobTypeRegistry()
    ledger = reg.job_type("ledger", input=Num, mode="atomic")
    client = await (make_client(reg) if store is None else make_client(reg, store=store))
    started = await client.start_chain(conn, ledger, Num(n=1))
    await conn.commit()
    return Refusal(client, ledger, started)


async def test_a_worker_grouping_atomic_attempts_refuses_a_sync_atomic_handler(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    refusal = await _refusal(make_client, conn)
    error = await refusal.refused(atomic_group=4)
    assert error.atomic_group == 4
    assert "atomic_group=4" in str(error)
    assert "atomic_group=1" in str(error)

    # Accepted: the same handler ungrouped, and an async one grouped.
    client, ledger = refusal.client, refusal.ledger
    create_in_process_worker(client=client, processors={ledger: refusal.post})
    create_in_process_worker(client=client, processors={ledger: refusal.post_async}, atomic_group=4)


def _atomic_without_lending(adapter: PostgresStateAdapter) -> CoreOnly:
    """PostgreSQL seen as a store with the core and atomic attempts, which cannot lend
    an attempt's transaction to a thread (no ``TransactionLending``)."""
    store = CoreOnly(adapter)
    for name in operations(AtomicAttempts):
        setattr(store, name, getattr(adapter, name))
    return store


async def test_a_store_that_cannot_lend_refuses_a_sync_atomic_handler_when_built(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Refused before the worker exists, rather than failing every attempt of the type
    at its start. (Control: without the check in ``_build``, the worker is built.)"""
    refusal = await _refusal(make_client, conn, store=_atomic_without_lending)
    # The view is what it claims: atomic attempts, no lending.
    assert refusal.client.capabilities.atomic is not None
    assert refusal.client.capabilities.lending is None
    error = await refusal.refused()
    assert error.store_type == "CoreOnly"
    assert "TransactionLending" in str(error)
    assert "`async def`" in str(error)

    # Accepted: an async handler of the type on this store, the sync one on PostgreSQL.
    create_in_process_worker(client=refusal.client, processors={refusal.ledger: refusal.post_async})
    lending = await make_client(refusal.client.registry)
    assert lending.capabilities.lending is not None
    create_in_process_worker(client=lending, processors={refusal.ledger: refusal.post})
