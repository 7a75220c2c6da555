"""One enqueue specification, run over every kind of caller connection pgwork accepts.

Each kind is a caller's own transaction as an application holds it: psycopg (async and
blocking), asyncpg, SQLAlchemy's async and sync ``Connection`` (``engine.connect()``
with commit-as-you-go, and an explicit ``begin()``) and ``Session`` (autobegin, and
``begin()``) on the psycopg and asyncpg dialects. For each: commit -> the job exists;
rollback -> no job; batches large enough for COPY, dedup, blockers, schedules, and
wake-up notices only once the caller commits. Blocking kinds go through
``start_chains_sync`` in a worker thread (no event loop there).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import psycopg
import psycopg.sql
import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from pgwork import (
    ChainStart,
    Client,
    JobNotFoundError,
    JobStatus,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    SchemaMissingError,
    StartedChain,
    UnsupportedConnectionError,
    create_client,
)
from pgwork.errors import IsolationLevelError, UnencodableTextError
from pgwork.postgres import migrate
from pgwork.postgres._callers import to_numbered
from pgwork.testing.databases import database_dsn, drop_database, unique_database_name

pytestmark = pytest.mark.anyio


class Email(BaseModel):
    to: str


@dataclass
class Tx:
    """A caller's open transaction, and how this kind of caller ends it."""

    handle: object
    commit: Callable[[], Awaitable[None]]
    rollback: Callable[[], Awaitable[None]]
    blocking: bool

    async def start_chains(
        self, client: Client, items: list[ChainStart[Any]]
    ) -> list[StartedChain[Any, Any]]:
        if self.blocking:
            return await anyio.to_thread.run_sync(client.start_chains_sync, self.handle, items)
        return await client.start_chains(self.handle, items)


Opener = Callable[[], Any]  # () -> async context manager of Tx


def _url(dsn: str, driver: str) -> str:
    return dsn.replace("postgresql://", f"postgresql+{driver}://", 1)


def _in_thread(fn: Callable[[], object]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        await anyio.to_thread.run_sync(fn)

    return run


@asynccontextmanager
async def _kinds(kind: str, dsn: str) -> AsyncIterator[Opener]:
    """An opener of fresh transactions of ``kind`` on ``dsn``, with its engine/pool."""
    if kind == "psycopg":

        @asynccontextmanager
        async def psycopg_tx() -> AsyncIterator[Tx]:
            async with await psycopg.AsyncConnection.connect(dsn) as c:
                yield Tx(c, c.commit, c.rollback, blocking=False)

        yield psycopg_tx
    elif kind == "asyncpg":

        @asynccontextmanager
        async def asyncpg_tx() -> AsyncIterator[Tx]:
            c = await asyncpg.connect(dsn)
            try:
                tr = c.transaction()
                await tr.start()
                yield Tx(c, tr.commit, tr.rollback, blocking=False)
            finally:
                await c.close()

        yield asyncpg_tx
    elif kind == "psycopg-sync":

        @asynccontextmanager
        async def sync_tx() -> AsyncIterator[Tx]:
            c = psycopg.connect(dsn)
            try:
                yield Tx(c, _in_thread(c.commit), _in_thread(c.rollback), blocking=True)
            finally:
                c.close()

        yield sync_tx
    elif kind.startswith("sa-async-"):
        _, _, driver, form = kind.split("-")
        engine = create_async_engine(_url(dsn, driver))
        try:
            yield _sa_async_opener(engine, form)
        finally:
            await engine.dispose()
    else:
        _, _, driver, form = kind.split("-")
        engine = sa.create_engine(_url(dsn, driver))
        try:
            yield _sa_sync_opener(engine, form)
        finally:
            engine.dispose()


def _sa_async_opener(engine: Any, form: str) -> Opener:
    @asynccontextmanager
    async def opener() -> AsyncIterator[Tx]:
        if form in ("connect", "begin"):
            async with engine.connect() as c:
                if form == "begin":
                    trans = await c.begin()
                    yield Tx(c, trans.commit, trans.rollback, blocking=False)
                else:  # commit as you go: nothing begun before pgwork's statements
                    yield Tx(c, c.commit, c.rollback, blocking=False)
        else:
            async with AsyncSession(engine) as s:
                if form == "sessionbegin":
                    await s.begin()
                yield Tx(s, s.commit, s.rollback, blocking=False)

    return opener


def _sa_sync_opener(engine: Any, form: str) -> Opener:
    @asynccontextmanager
    async def opener() -> AsyncIterator[Tx]:
        if form in ("connect", "begin"):
            c = engine.connect()
            try:
                if form == "begin":
                    trans = c.begin()
                    yield Tx(c, _in_thread(trans.commit), _in_thread(trans.rollback), True)
                else:
                    yield Tx(c, _in_thread(c.commit), _in_thread(c.rollback), True)
            finally:
                c.close()
        else:
            s = Session(engine)
            try:
                if form == "sessionbegin":
                    s.begin()
                yield Tx(s, _in_thread(s.commit), _in_thread(s.rollback), True)
            finally:
                s.close()

    return opener


_SA_FORMS = ("connect", "begin", "session", "sessionbegin")
KINDS = [
    "psycopg",
    "asyncpg",
    "psycopg-sync",
    *(f"sa-async-psycopg-{f}" for f in _SA_FORMS),
    *(f"sa-async-asyncpg-{f}" for f in _SA_FORMS),
    *(f"sa-sync-psycopg-{f}" for f in _SA_FORMS),
]


ASYNC_KINDS = [k for k in KINDS if k != "psycopg-sync" and not k.startswith("sa-sync-")]


@pytest.fixture(params=KINDS)
async def kind(request: pytest.FixtureRequest, pgwork_dsn: str) -> AsyncIterator[Opener]:
    async with _kinds(request.param, pgwork_dsn) as opener:
        yield opener


@pytest.fixture(params=ASYNC_KINDS)
async def async_kind(request: pytest.FixtureRequest, pgwork_dsn: str) -> AsyncIterator[Opener]:
    """The connection kinds the async control calls (cancel, get_job, ...) take."""
    async with _kinds(request.param, pgwork_dsn) as opener:
        yield opener


@pytest.fixture
async def client(pgwork_dsn: str) -> AsyncIterator[Client]:
    reg = JobTypeRegistry()
    reg.job_type("send_email", input=Email)
    state = await PostgresStateAdapter.connect(pgwork_dsn)
    c = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=reg,
        observers=[],
    )
    yield c
    await c.close()


def _send(client: Client, n: int = 1, **options: Any) -> list[ChainStart[Any]]:
    send = client.registry.get("send_email")
    return [ChainStart(send, Email(to=f"{i}@example.com"), **options) for i in range(n)]


async def _count(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute("SELECT count(*) FROM pgwork.jobs")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_a_committed_job_exists(kind: Opener, client: Client) -> None:
    async with kind() as tx:
        [started] = await tx.start_chains(client, _send(client))
        await tx.commit()
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.PENDING
    assert job.input == Email(to="0@example.com")


async def test_a_rolled_back_job_does_not_exist(kind: Opener, client: Client) -> None:
    async with kind() as tx:
        [started] = await tx.start_chains(client, _send(client))
        await tx.rollback()
    with pytest.raises(JobNotFoundError):
        await client.get_job(started.job_id)


async def test_a_batch_large_enough_for_copy_commits_and_rolls_back_whole(
    kind: Opener, client: Client, pgwork_dsn: str
) -> None:
    async with kind() as tx:
        started = await tx.start_chains(client, _send(client, 300))
        await tx.rollback()
    assert len(started) == 300
    assert await _count(pgwork_dsn) == 0
    async with kind() as tx:
        started = await tx.start_chains(client, _send(client, 300))
        await tx.commit()
    assert await _count(pgwork_dsn) == 300
    assert {s.status for s in started} == {JobStatus.PENDING}


async def test_a_limit_key_is_stored_by_every_statement(
    kind: Opener, client: Client, pgwork_dsn: str
) -> None:
    # One job, a few (INSERT_PLAIN_JOBS), a batch for COPY, a scheduled few (INSERT_JOBS).
    async with kind() as tx:
        await tx.start_chains(client, _send(client, limit_key="one"))
        await tx.start_chains(client, _send(client, 3, limit_key="few"))
        await tx.start_chains(client, _send(client, 300, limit_key="copied"))
        await tx.start_chains(client, _send(client, 2, limit_key="t", schedule=timedelta(hours=1)))
        await tx.start_chains(client, _send(client, 2))
        await tx.commit()
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT limit_key, count(*) FROM pgwork.jobs GROUP BY 1 ORDER BY 1 NULLS FIRST"
        )
        counts = await cur.fetchall()
    assert counts == [(None, 2), ("copied", 300), ("few", 3), ("one", 1), ("t", 2)]


async def test_a_dedup_key_returns_the_committed_chain(kind: Opener, client: Client) -> None:
    async with kind() as tx:
        [first] = await tx.start_chains(client, _send(client, dedup="k"))
        await tx.commit()
    async with kind() as tx:
        [again] = await tx.start_chains(client, _send(client, dedup="k"))
        await tx.commit()
    assert again.deduplicated
    assert again.id == first.id


async def _set_default_isolation(dsn: str, level: str) -> None:
    """Make ``level`` the default of every transaction begun on this test's database."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        name = c.info.dbname
        await c.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Literal(level)
            )
        )


async def _lock_waiters(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
async def test_a_dedup_key_above_read_committed_is_refused_and_the_transaction_goes_on(
    kind: Opener, client: Client, pgwork_dsn: str, level: str
) -> None:
    """Two callers enqueue one key, the second while the first is still open. At
    REPEATABLE READ the second's snapshot predates the first's commit, so the key's lock
    alone let both start a chain; each is refused instead, before writing anything."""
    await _set_default_isolation(pgwork_dsn, level)
    outcomes: dict[str, str] = {}

    async def enqueue(name: str, tx: Tx) -> None:
        try:
            await tx.start_chains(client, _send(client, dedup="one-key"))
            outcomes[name] = "started"
        except IsolationLevelError as exc:
            outcomes[name] = exc.isolation_level
        # The caller's transaction goes on: its own other write commits.
        await tx.start_chains(client, _send(client))

    async with kind() as first, kind() as second:
        await enqueue("first", first)
        async with anyio.create_task_group() as tg:
            tg.start_soon(enqueue, "second", second)
            # Until the second is refused, or waits for the first's lock.
            with anyio.fail_after(10):
                while True:
                    if "second" in outcomes or await _lock_waiters(pgwork_dsn):
                        break
                    await anyio.sleep(0.01)
            await first.commit()
        await second.commit()
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
        cur = await c.execute("SELECT count(dedup_key), count(*) FROM pgwork.jobs")
        counts = await cur.fetchone()
    assert (outcomes, counts) == ({"first": level, "second": level}, (0, 2))


async def test_a_blocked_job_waits_for_its_blocker_in_the_same_transaction(
    kind: Opener, client: Client
) -> None:
    async with kind() as tx:
        [blocker] = await tx.start_chains(client, _send(client))
        [blocked] = await tx.start_chains(client, _send(client, blockers=[blocker]))
        await tx.commit()
    assert blocked.status is JobStatus.BLOCKED
    assert (await client.get_job(blocked.job_id)).status is JobStatus.BLOCKED


async def test_a_scheduled_job_is_due_later(kind: Opener, client: Client) -> None:
    async with kind() as tx:
        [started] = await tx.start_chains(client, _send(client, schedule=timedelta(hours=1)))
        await tx.commit()
    job = await client.get_job(started.job_id)
    assert job.scheduled_at - job.created_at >= timedelta(minutes=59)


async def test_wake_up_notices_arrive_only_after_commit(
    kind: Opener, client: Client, pgwork_dsn: str
) -> None:
    assert isinstance(client.notify, PostgresNotifyAdapter)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as listener:
        await listener.execute(f'LISTEN "{client.notify.channel}"')

        async def drained() -> list[str]:
            await listener.execute("SELECT 1")  # a round trip: pending notices are read
            return [n.payload async for n in listener.notifies(timeout=0.0)]

        async with kind() as tx:
            await tx.start_chains(client, _send(client, 3))
            await tx.start_chains(client, _send(client, 100))  # the COPY path
            assert await drained() == []
            await tx.commit()
        with anyio.fail_after(10):
            note = await anext(listener.notifies(timeout=10))
        assert "ready" in note.payload


async def test_control_calls_run_in_the_callers_transaction(
    async_kind: Opener, client: Client
) -> None:
    kind = async_kind
    async with kind() as tx:
        [started] = await tx.start_chains(client, _send(client))
        await tx.commit()
    async with kind() as tx:
        assert not tx.blocking
        job = await client.get_job(started.job_id, tx=tx.handle)
        assert job.input == Email(to="0@example.com")
        assert await client.cancel(tx.handle, [started.id]) == [started.id]
        await tx.rollback()
    assert (await client.get_job(started.job_id)).status is JobStatus.PENDING
    async with kind() as tx:
        await client.cancel(tx.handle, [started.id])
        await tx.commit()
    assert (await client.get_job(started.job_id)).status is JobStatus.CANCELLED


# --- the blocking API starts no event loop ------------------------------------------


async def test_start_chain_sync_runs_in_a_thread_without_creating_an_event_loop(
    client: Client, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[str] = []

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            created.append(name)
            return real(*args, **kwargs)

        return wrapper

    for name in ("new_event_loop", "run", "get_event_loop"):
        monkeypatch.setattr(asyncio, name, counting(name, getattr(asyncio, name)))
    monkeypatch.setattr(anyio, "run", counting("anyio.run", anyio.run))
    send = client.registry.get("send_email")
    result: list[StartedChain[Any, Any]] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with psycopg.connect(pgwork_dsn) as c:  # commits on clean exit
                result.append(client.start_chain_sync(c, send, Email(to="t@example.com")))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    await anyio.to_thread.run_sync(thread.join)
    assert errors == []
    assert created == []
    assert (await client.get_job(result[0].job_id)).status is JobStatus.PENDING


async def test_the_async_calls_refuse_a_blocking_connection_and_vice_versa(
    client: Client, pgwork_dsn: str
) -> None:
    send = client.registry.get("send_email")
    with (
        psycopg.connect(pgwork_dsn) as sync_conn,
        pytest.raises(UnsupportedConnectionError, match="start_chain_sync"),
    ):
        await client.start_chain(sync_conn, send, Email(to="x"))
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as async_conn:
        with pytest.raises(UnsupportedConnectionError, match="use start_chain"):
            client.start_chain_sync(async_conn, send, Email(to="x"))


async def test_an_asyncpg_connection_outside_a_transaction_is_refused(
    client: Client, pgwork_dsn: str
) -> None:
    c = await asyncpg.connect(pgwork_dsn)
    try:
        with pytest.raises(UnsupportedConnectionError, match="not in a transaction"):
            await client.start_chain(c, client.registry.get("send_email"), Email(to="x"))
    finally:
        await c.close()
    assert "a asyncpg" not in str(UnsupportedConnectionError(c))


def test_importing_pgwork_does_not_import_asyncpg() -> None:
    code = "import sys, pgwork, pgwork.postgres.state; sys.exit('asyncpg' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, timeout=60)
    assert done.returncode == 0


def test_psycopg_placeholders_become_numbered_once_per_name() -> None:
    sql, names = to_numbered(b"SELECT %(a)s, %(b)b::uuid[], %(a)s, 100%% FROM t WHERE x = %(c)t")
    assert sql == "SELECT $1, $2::uuid[], $1, 100% FROM t WHERE x = $3"
    assert names == ("a", "b", "c")


@pytest.mark.parametrize("kind", ["psycopg", "asyncpg", "psycopg-sync", "sa-async-asyncpg-begin"])
async def test_a_database_without_the_schema_is_reported_alike_on_every_driver(
    client: Client, empty_database_dsn: str, kind: str
) -> None:
    """asyncpg raises its own exception classes; pgwork translates by SQLSTATE, so the
    caller catches the same ``SchemaMissingError`` (with the next step) whatever it
    drives. Control: translating by psycopg's classes let asyncpg's
    ``UndefinedTableError`` through."""
    send = client.registry.get("send_email")
    async with _kinds(kind, empty_database_dsn) as opener, opener() as tx:
        with pytest.raises(SchemaMissingError, match="pgwork migrate"):
            await tx.start_chains(client, [ChainStart(send, Email(to="x"))])
        await tx.rollback()


@pytest.fixture(scope="module")
def latin1_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A migrated database in LATIN1, which stores "é" but not "€"."""
    name = unique_database_name()
    with psycopg.connect(pg_server_dsn, autocommit=True) as c:
        c.execute(
            psycopg.sql.SQL(
                "CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            ).format(psycopg.sql.Identifier(name))
        )
    try:
        dsn = database_dsn(pg_server_dsn, name)
        migrate.upgrade(dsn)
        yield dsn
    finally:
        drop_database(pg_server_dsn, name)


UNSTORABLE: list[tuple[str, dict[str, Any], str]] = [
    ("input", {"input": Email(to="caf€")}, "input of job type 'send_email' at $.to"),
    ("dedup", {"dedup": "clé-€"}, "dedup key"),
    ("context", {"context": {"note": "5 €"}}, "context['note']"),
    ("limit_key", {"limit_key": "tenant €"}, "limit key"),
]


@pytest.mark.parametrize("kind_name", KINDS)
@pytest.mark.parametrize(("case", "options", "field"), UNSTORABLE, ids=[u[0] for u in UNSTORABLE])
async def test_a_character_the_database_cannot_store_is_named_before_anything_is_written(
    latin1_dsn: str, kind_name: str, case: str, options: dict[str, Any], field: str
) -> None:
    reg = JobTypeRegistry()
    send = reg.job_type("send_email", input=Email)
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(latin1_dsn),
        registry=reg,
        observers=[],
    )
    marker = f"{kind_name}-{case}"
    fine = [ChainStart(send, Email(to=f"{marker}-é-{i}"), queue=marker) for i in range(299)]
    options = {"input": Email(to=marker), **options}
    bad = ChainStart(send, options.pop("input"), queue=marker, **options)
    try:
        async with _kinds(kind_name, latin1_dsn) as kind, kind() as tx:
            # A batch large enough for COPY, the character in its last job.
            with pytest.raises(UnencodableTextError) as caught:
                await tx.start_chains(client, [*fine, bad])
            assert (caught.value.field, caught.value.encoding) == (field, "LATIN1")
            assert caught.value.character == "€"
            # The caller's transaction goes on: its own other write commits.
            await tx.start_chains(client, [ChainStart(send, Email(to="é"), queue=marker)])
            await tx.commit()
        async with await psycopg.AsyncConnection.connect(latin1_dsn) as c:
            cur = await c.execute("SELECT input->>'to' FROM pgwork.jobs WHERE queue = %s", [marker])
            assert await cur.fetchall() == [("é",)]
    finally:
        await client.close()


async def test_one_start_chain_names_a_character_the_database_cannot_store(
    latin1_dsn: str,
) -> None:
    reg = JobTypeRegistry()
    send = reg.job_type("send_email", input=Email)
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(latin1_dsn), registry=reg, observers=[]
    )
    try:
        async with await psycopg.AsyncConnection.connect(latin1_dsn) as c:
            with pytest.raises(UnencodableTextError, match=r"at \$\.to contains '€'.*LATIN1"):
                await client.start_chain(c, send, Email(to="one €"))
            started = await client.start_chain(c, send, Email(to="one é"))
            await c.commit()
        assert (await client.get_job(started.job_id)).input == Email(to="one é")
    finally:
        await client.close()


async def test_a_dedup_key_at_read_uncommitted_is_read_committed_in_postgresql(
    client: Client, pgwork_dsn: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as c:
        await c.set_isolation_level(psycopg.IsolationLevel.READ_UNCOMMITTED)
        [first] = await client.start_chains(c, _send(client, dedup="k"))
        [again] = await client.start_chains(c, _send(client, dedup="k"))
        await c.commit()
    assert again.deduplicated
    assert again.id == first.id
