"""An atomic attempt's transaction lent to a sync handler's thread.

A store that offers ``TransactionLending`` hands a plain ``def`` handler of an atomic
job type a blocking DB-API connection in the attempt's own transaction. Here the
handler is a thread of the suite's that opens the loan, writes through the connection
with plain SQL (a table of its own, ``INSERT`` of literals, ``SELECT``), and closes the
loan, as the worker's threads do. What it wrote is read back through the loan of a
later atomic attempt: the suite sees the store only through the protocol.

What must hold: the handler's writes commit with the attempt's completion, and vanish
with its transaction (an error out of the attempt, a refused completion, a discarded
transaction); ``commit`` keeps what the handler wrote so far and ``rollback`` undoes
what it wrote since, neither acting on the transaction beyond the handler's part nor
committing anything before the completion; each statement first calls the ``check``
given to ``lend_transaction``; the connection is usable from the borrowing thread
alone, and by nobody once the loan has closed. (``interrupt``, which cancels a
statement in progress, needs a statement that runs for a while, which plain SQL does
not give; the worker's tests on PostgreSQL cover it.)

Role exercised: ``WorkerStore`` (``TransactionLending`` with ``AtomicAttempts``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import pytest

from pgwork.adapters.state import (
    AcquiredJob,
    AtomicAttempts,
    Completion,
    StateAdapter,
    TransactionHandle,
    TransactionLending,
    TransactionLoan,
)
from pgwork.records import JobStatus
from pgwork.testing.conformance._harness import ALPHA, StateHarness, StateSuiteBase, requires

T = TypeVar("T")

DEADLINE = timedelta(seconds=30)
# The jobs whose attempts only read what earlier attempts committed.
READER = "conformance.reader"


class _Stop(Exception):
    """What the suite's ``check`` raises once the attempt is told to stop."""


class _Failed(Exception):
    """Leaves an attempt's transaction without committing it, as a failed handler."""


def _nothing() -> None:
    """A ``check`` that never stops the borrower."""


class Handler:
    """A sync handler's thread with the loan open on it: the suite's stand-in for the
    worker's thread running a plain ``def`` handler. ``run`` runs a function of the
    blocking connection there; ``end`` closes the loan, on that thread too."""

    def __init__(self, loan: TransactionLoan) -> None:
        self.loan = loan
        self.connection: Any = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conformance-sync")
        self.ident = 0

    async def start(self) -> None:
        def open_loan() -> None:
            self.ident = threading.get_ident()
            self.connection = self.loan.open()

        await self._on_thread(open_loan)

    async def run(self, work: Callable[[Any], T]) -> T:
        return await self._on_thread(lambda: work(self.connection))

    async def end(self) -> None:
        await self._on_thread(self.loan.close)

    def shutdown(self) -> None:
        """Let the thread go (once the loan has ended)."""
        self._thread.shutdown(wait=False)

    async def _on_thread(self, work: Callable[[], T]) -> T:
        future = self._thread.submit(work)
        return await anyio.to_thread.run_sync(future.result)


@asynccontextmanager
async def lent(
    state_adapter: StateAdapter, tx: TransactionHandle, check: Callable[[], None] = _nothing
) -> AsyncIterator[Handler]:
    """``tx`` lent to a handler's thread for the block; the loan closes as it ends."""
    handler = Handler(state_adapter.lend_transaction(tx, check=check))
    try:
        await handler.start()
        try:
            yield handler
        finally:
            await handler.end()
    finally:
        handler.shutdown()


def execute(sql: str) -> Callable[[Any], None]:
    """Run ``sql`` on the blocking connection (a DB-API cursor's ``execute``)."""

    def run(connection: Any) -> None:
        cursor = connection.cursor()
        try:
            cursor.execute(sql)
        finally:
            cursor.close()

    return run


def insert(table: str, n: int) -> Callable[[Any], None]:
    return execute(f"INSERT INTO {table} (n) VALUES ({n})")


def select(table: str) -> Callable[[Any], list[int]]:
    """The ``n`` of ``table``'s rows, in order, as the connection's transaction sees them."""

    def run(connection: Any) -> list[int]:
        cursor = connection.cursor()
        try:
            cursor.execute(f"SELECT n FROM {table} ORDER BY n")
            return [row[0] for row in cursor.fetchall()]
        finally:
            cursor.close()

    return run


def raises(work: Callable[[Any], Any]) -> Callable[[Any], BaseException | None]:
    """``work``, returning what it raised (None if it raised nothing)."""

    def run(connection: Any) -> BaseException | None:
        try:
            work(connection)
        except Exception as exc:
            return exc
        return None

    return run


def done(job: AcquiredJob, output: str = '"lent"') -> Completion:
    return Completion(job.id, job.lease_token, output)


@asynccontextmanager
async def attempt(
    state_adapter: StateAdapter, store: StateHarness, type_name: str = ALPHA
) -> AsyncIterator[tuple[AcquiredJob, TransactionHandle]]:
    """A new job of ``type_name``, acquired, and its atomic attempt's transaction,
    open for the block (committed as the block ends, unless completed first or left
    with an error)."""
    await store.seed(store.new_job(type_name))
    job = await store.acquire_one(type_name)
    async with state_adapter.atomic_transaction(lease=job.lease, deadline=DEADLINE) as tx:
        assert tx is not None
        yield job, tx


async def complete(state_adapter: StateAdapter, tx: TransactionHandle, job: AcquiredJob) -> None:
    """Complete ``job``'s atomic attempt in ``tx``, which commits with it."""
    result = await state_adapter.complete_atomic(tx, completion=done(job))
    assert result.accepted, f"the completion of {job.id} was refused"


async def committed(state_adapter: StateAdapter, store: StateHarness, table: str) -> list[int]:
    """What ``table`` holds, read through the loan of another atomic attempt: what
    the attempts before it committed, and nothing they still have open."""
    rows: list[int] = []
    async with (
        attempt(state_adapter, store, READER) as (_, tx),
        lent(state_adapter, tx) as handler,
    ):
        rows = await handler.run(select(table))
    return rows


@requires(AtomicAttempts, TransactionLending)
class TransactionLendingConformance(StateSuiteBase):
    @pytest.fixture
    async def table(self, state_adapter: StateAdapter, store: StateHarness) -> str:
        """An empty table of the application's, created by an atomic attempt's handler
        and committed with that attempt."""
        name = f"conformance_lent_{uuid.uuid4().hex[:12]}"
        async with attempt(state_adapter, store, READER) as (job, tx):
            async with lent(state_adapter, tx) as handler:
                await handler.run(execute(f"CREATE TABLE {name} (n integer NOT NULL)"))
            await complete(state_adapter, tx, job)
        return name

    async def test_a_loans_writes_commit_with_the_attempts_completion(
        self, state_adapter: StateAdapter, store: StateHarness, table: str
    ) -> None:
        async with attempt(state_adapter, store) as (job, tx):
            async with lent(state_adapter, tx) as handler:
                await handler.run(insert(table, 1))
                await handler.run(insert(table, 2))
                # The handler's transaction sees its own writes.
                assert await handler.run(select(table)) == [1, 2]
            # Nothing commits before the completion.
            assert await committed(state_adapter, store, table) == []
            await complete(state_adapter, tx, job)
        assert await committed(state_adapter, store, table) == [1, 2]
        stored = await store.job(job.id)
        assert (stored.status, stored.output) == (JobStatus.COMPLETED, "lent")

    async def test_a_loans_writes_vanish_when_the_attempts_transaction_rolls_back(
        self, state_adapter: StateAdapter, store: StateHarness, table: str
    ) -> None:
        """A handler's writes, kept with its ``commit``, vanish when the attempt's
        transaction ends without committing: an error out of it, or a completion the
        lease no longer holds."""
        held: list[AcquiredJob] = []

        async def fail_after_writing() -> None:
            async with attempt(state_adapter, store) as (failing, tx):
                held.append(failing)
                async with lent(state_adapter, tx) as handler:
                    await handler.run(insert(table, 1))
                    await handler.run(lambda connection: connection.commit())
                raise _Failed

        with pytest.raises(_Failed):
            await fail_after_writing()
        async with attempt(state_adapter, store) as (refused, tx):
            held.append(refused)
            async with lent(state_adapter, tx) as handler:
                await handler.run(insert(table, 2))
                await handler.run(lambda connection: connection.commit())
            forged = Completion(refused.id, uuid.uuid4(), '"forged"')
            result = await state_adapter.complete_atomic(tx, completion=forged)
        assert not result.accepted
        assert await committed(state_adapter, store, table) == []
        for job in held:
            assert (await store.job(job.id)).status is JobStatus.RUNNING

    async def test_commit_and_rollback_on_a_lent_connection_act_on_the_handlers_part_only(
        self, state_adapter: StateAdapter, store: StateHarness, table: str
    ) -> None:
        """``commit`` keeps what the handler wrote so far, for the completion (it
        commits nothing on its own); ``rollback`` undoes what it wrote since, and
        leaves the transaction usable after an error; neither touches what the
        attempt wrote in the transaction before the handler (here: another job's
        completion)."""
        async with attempt(state_adapter, store) as (job, tx):
            await store.seed(store.new_job())
            side = await store.acquire_one()
            [before] = await state_adapter.complete(tx, completions=[done(side, '"side"')])
            assert before.accepted
            async with lent(state_adapter, tx) as handler:
                await handler.run(insert(table, 1))
                await handler.run(lambda connection: connection.commit())
                await handler.run(insert(table, 2))
                await handler.run(lambda connection: connection.rollback())
                assert await handler.run(select(table)) == [1]
                await handler.run(insert(table, 3))
                error = await handler.run(raises(select(f"{table}_missing")))
                assert error is not None, "a statement on a missing table raised nothing"
                await handler.run(lambda connection: connection.rollback())
                await handler.run(insert(table, 4))
                assert await handler.run(select(table)) == [1, 4]
                # The handler's commit kept its rows for the job, committing none.
                assert await committed(state_adapter, store, table) == []
            await complete(state_adapter, tx, job)
        assert await committed(state_adapter, store, table) == [1, 4]
        assert (await store.job(side.id)).output == "side"
        assert (await store.job(job.id)).status is JobStatus.COMPLETED

    async def test_every_use_of_a_lent_connection_raises_once_the_loan_closed(
        self, state_adapter: StateAdapter, store: StateHarness, table: str
    ) -> None:
        async with attempt(state_adapter, store) as (job, tx):
            handler = Handler(state_adapter.lend_transaction(tx, check=_nothing))
            try:
                await handler.start()
                await handler.run(insert(table, 1))
                await handler.end()
                late = [
                    insert(table, 2),
                    select(table),
                    lambda connection: connection.commit(),
                    lambda connection: connection.rollback(),
                ]
                for use in late:  # on the thread it was lent to, and on another
                    assert await handler.run(raises(use)) is not None
                    other = await anyio.to_thread.run_sync(raises(use), handler.connection)
                    assert other is not None
            finally:
                handler.shutdown()
            await complete(state_adapter, tx, job)
        assert await committed(state_adapter, store, table) == [1]

    async def test_a_lent_connection_refuses_any_thread_but_the_borrowers(
        self, state_adapter: StateAdapter, store: StateHarness, table: str
    ) -> None:
        async with attempt(state_adapter, store) as (job, tx):
            async with lent(state_adapter, tx) as handler:
                await handler.run(insert(table, 1))
                elsewhere = raises(insert(table, 2))
                other = await anyio.to_thread.run_sync(elsewhere, handler.connection)
                assert other is not None, "a thread other than the borrower's wrote"
                assert threading.get_ident() != handler.ident
                assert elsewhere(handler.connection) is not None  # the event loop's
                # The borrower goes on, its transaction intact.
                await handler.run(insert(table, 3))
                assert await handler.run(select(table)) == [1, 3]
            await complete(state_adapter, tx, job)
        assert await committed(state_adapter, store, table) == [1, 3]

    async def test_each_statement_of_a_loan_calls_its_check_first(
        self, state_adapter: StateAdapter, store: StateHarness, table: str
    ) -> None:
        """Once ``check`` raises (the attempt was told to stop), so does every
        statement, with what ``check`` raised, and nothing of it runs."""
        stopped = threading.Event()

        def check() -> None:
            if stopped.is_set():
                raise _Stop

        async with attempt(state_adapter, store) as (job, tx):
            async with lent(state_adapter, tx, check) as handler:
                await handler.run(insert(table, 1))
                stopped.set()
                assert isinstance(await handler.run(raises(insert(table, 2))), _Stop)
                assert isinstance(await handler.run(raises(select(table))), _Stop)
                stopped.clear()
                assert await handler.run(select(table)) == [1]
            await complete(state_adapter, tx, job)
        assert await committed(state_adapter, store, table) == [1]

    async def test_a_discarded_transaction_fails_its_borrower_and_keeps_nothing(
        self, state_adapter: StateAdapter, store: StateHarness, table: str
    ) -> None:
        """A handler given up on: its transaction is discarded while the loan is open;
        every later statement of the borrower fails, and nothing it wrote commits."""
        held: list[AcquiredJob] = []

        async def given_up_on() -> None:
            async with attempt(state_adapter, store) as (job, tx):
                held.append(job)
                async with lent(state_adapter, tx) as handler:
                    await handler.run(insert(table, 1))
                    await handler.run(lambda connection: connection.commit())
                    await tx.discard()
                    assert await handler.run(raises(insert(table, 2))) is not None
                    assert await handler.run(raises(select(table))) is not None
                raise _Failed  # as the worker leaves the block of an attempt given up on

        with pytest.raises(_Failed):
            await given_up_on()
        assert await committed(state_adapter, store, table) == []
        [job] = held
        assert (await store.job(job.id)).status is JobStatus.RUNNING
