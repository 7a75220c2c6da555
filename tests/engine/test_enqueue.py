"""Enqueueing: start_chain / start_chains inside the caller's own transaction."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from typing_extensions import TypedDict

from pgwork import (
    ChainStart,
    ConfigurationError,
    DedupSpec,
    JobNotFoundError,
    JobStatus,
    JobTypeRegistry,
    NotAnEntryTypeError,
    Notice,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PayloadValidationError,
    UnknownJobTypeError,
    UnsupportedConnectionError,
)

from .conftest import ClientFactory, scalar

pytestmark = pytest.mark.anyio


class Email(BaseModel):
    to: str
    subject: str = "hello"


class Anything(BaseModel):
    data: dict[str, Any]


@dataclasses.dataclass
class Resize:
    width: int
    height: int


class Ping(TypedDict):
    host: str


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("send_email", input=Email)
    reg.job_type("anything", input=Anything)
    reg.job_type("resize", input=Resize)
    reg.job_type("ping", input=Ping)
    reg.job_type("step_two", input=Email, entry=False)
    return reg


async def test_committed_chain_exists_and_its_first_job_is_pending(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    send = client.registry.get("send_email")
    started = await client.start_chain(conn, send, Email(to="a@example.com"))
    await conn.commit()
    assert started.id == started.job_id
    assert not started.deduplicated
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.PENDING
    assert job.input == Email(to="a@example.com")
    assert job.chain_id == started.id
    assert job.chain_index == 0
    chain = await client.get_chain(started.id)
    assert chain.status == "active"
    assert chain.input == Email(to="a@example.com")


async def test_rollback_leaves_no_job_and_wakes_no_worker(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    async with client.notify.listen() as listener:
        started = await client.start_chain(conn, "send_email", Email(to="x@example.com"))  # type: ignore[arg-type]
        await conn.rollback()
        assert await listener.wait(0.5) == []
        with pytest.raises(JobNotFoundError):
            await client.get_job(started.job_id)
        # The same call committed does wake listeners: the silence above was the rollback.
        await client.start_chain(conn, client.registry.get("send_email"), Email(to="y@x.org"))
        await conn.commit()
        assert Notice(kind="ready", queue="default") in await listener.wait(5.0)


async def test_identical_wakeups_in_one_transaction_arrive_once(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    send = client.registry.get("send_email")
    async with client.notify.listen() as listener:
        for i in range(5):
            await client.start_chain(conn, send, Email(to=f"{i}@example.com"))
        await conn.commit()
        notices = await listener.wait(5.0)
        notices += await listener.wait(0.3)
    assert notices == [Notice(kind="ready", queue="default")]


async def test_sqlalchemy_async_session_enqueue_commits_with_the_sessions_own_rows(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    engine = create_async_engine(pgwork_dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        async with engine.begin() as c:
            await c.execute(sa.text("CREATE TABLE signups (email text PRIMARY KEY)"))
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.text("INSERT INTO signups VALUES ('kept@example.com')"))
            kept = await client.start_chain(
                session, client.registry.get("send_email"), Email(to="kept@example.com")
            )
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.text("INSERT INTO signups VALUES ('gone@example.com')"))
            gone = await client.start_chain(
                session, client.registry.get("send_email"), Email(to="gone@example.com")
            )
            await session.rollback()
        assert await scalar(pgwork_dsn, "SELECT count(*) FROM signups") == 1
        assert (await client.get_job(kept.job_id)).input.to == "kept@example.com"
        with pytest.raises(JobNotFoundError):
            await client.get_job(gone.job_id)
    finally:
        await engine.dispose()


async def test_sqlalchemy_async_connection_uses_the_same_transaction(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    engine = create_async_engine(pgwork_dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        async with engine.connect() as sa_conn:
            trans = await sa_conn.begin()
            started = await client.start_chain(
                sa_conn, client.registry.get("resize"), Resize(width=10, height=20)
            )
            backend = await sa_conn.scalar(sa.text("SELECT pg_backend_pid()"))
            await trans.rollback()
        with pytest.raises(JobNotFoundError):
            await client.get_job(started.job_id)
        assert backend is not None
    finally:
        await engine.dispose()


async def test_start_chains_inserts_a_large_batch_in_chunks(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    resize = client.registry.get("resize")
    items = [ChainStart(resize, Resize(width=i, height=i)) for i in range(12_000)]
    started = await client.start_chains(conn, items)
    await conn.commit()
    assert len({s.id for s in started}) == 12_000
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 12_000


async def test_models_of_every_kind_round_trip(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    a = await client.start_chain(conn, client.registry.get("resize"), Resize(width=3, height=4))
    b = await client.start_chain(conn, client.registry.get("ping"), {"host": "db"})
    c = await client.start_chain(conn, client.registry.get("send_email"), {"to": "d@e.f"})
    await conn.commit()
    assert (await client.get_job(a.job_id)).input == Resize(width=3, height=4)
    assert (await client.get_job(b.job_id)).input == {"host": "db"}
    assert (await client.get_job(c.job_id)).input == Email(to="d@e.f")


async def test_schedule_in_the_past_is_clamped_to_now_and_future_is_kept(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    send = client.registry.get("send_email")
    past = await client.start_chain(
        conn, send, Email(to="p@x.y"), schedule=datetime(2001, 1, 1, tzinfo=UTC)
    )
    later = await client.start_chain(conn, send, Email(to="l@x.y"), schedule=timedelta(hours=1))
    await conn.commit()
    past_job = await client.get_job(past.job_id)
    later_job = await client.get_job(later.job_id)
    assert past_job.scheduled_at >= past_job.created_at
    assert later_job.scheduled_at - later_job.created_at >= timedelta(minutes=59)


async def test_dedup_key_returns_the_existing_chain(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    send = client.registry.get("send_email")
    first = await client.start_chain(conn, send, Email(to="a@b.c"), dedup="welcome:a@b.c")
    again = await client.start_chain(conn, send, Email(to="a@b.c"), dedup="welcome:a@b.c")
    await conn.commit()
    later = await client.start_chain(
        conn, send, Email(to="a@b.c"), dedup=DedupSpec("welcome:a@b.c", scope="ever")
    )
    await conn.commit()
    assert not first.deduplicated
    assert again.deduplicated
    assert again.id == first.id
    assert later.deduplicated
    assert later.id == first.id


# --- bad input: a named error, raised before any SQL, transaction still usable ---------


async def _still_usable(conn: psycopg.AsyncConnection[Any]) -> None:
    cur = await conn.execute("SELECT 1")
    assert await cur.fetchone() == (1,)
    await conn.commit()


async def test_unknown_job_type_names_the_known_types(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    with pytest.raises(UnknownJobTypeError) as err:
        await client.start_chain(conn, "send_mail", {"to": "x"})  # type: ignore[arg-type]
    assert "send_mail" in str(err.value)
    assert "'send_email'" in str(err.value)
    assert "send_email" in err.value.known_types
    other = JobTypeRegistry().job_type("send_email", input=Email)
    with pytest.raises(UnknownJobTypeError):
        await client.start_chain(conn, other, Email(to="x"))
    await _still_usable(conn)


async def test_a_type_that_cannot_start_a_chain_is_refused(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    with pytest.raises(NotAnEntryTypeError, match="step_two"):
        await client.start_chain(conn, client.registry.get("step_two"), Email(to="x"))
    await _still_usable(conn)


async def test_input_failing_its_model_is_refused(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    with pytest.raises(PayloadValidationError, match=r"\$\.width"):
        await client.start_chain(
            conn, client.registry.get("resize"), {"width": "wide", "height": 1}
        )
    await _still_usable(conn)


async def test_non_json_input_names_the_offending_path(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    bad = Anything(data={"items": [1, {"when": object()}]})
    with pytest.raises(PayloadNotSerializableError) as err:
        await client.start_chain(conn, client.registry.get("anything"), bad)
    assert err.value.path == "$.data.items[1].when"
    await _still_usable(conn)


async def test_nul_characters_and_nan_are_refused_with_their_path(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    anything = client.registry.get("anything")
    with pytest.raises(PayloadNotSerializableError) as err:
        await client.start_chain(conn, anything, Anything(data={"name": "a\x00b"}))
    assert err.value.path == "$.data.name"
    assert "NUL" in str(err.value)
    with pytest.raises(PayloadNotSerializableError) as err:
        await client.start_chain(conn, anything, Anything(data={"x": [float("nan")]}))
    assert err.value.path == "$.data.x[0]"
    await _still_usable(conn)


async def test_payload_over_the_cap_is_refused(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    with pytest.raises(PayloadTooLargeError) as err:
        await client.start_chain(
            conn, client.registry.get("anything"), Anything(data={"blob": "x" * 1_100_000})
        )
    assert err.value.limit == 1024 * 1024
    await _still_usable(conn)


async def test_naive_schedule_datetime_is_refused(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    with pytest.raises(ConfigurationError, match="timezone"):
        await client.start_chain(
            conn, client.registry.get("send_email"), Email(to="x"), schedule=datetime(2030, 1, 1)
        )
    await _still_usable(conn)


async def test_a_connection_pgwork_cannot_use_is_refused(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    send = client.registry.get("send_email")
    with psycopg.connect(pgwork_dsn) as sync_conn, pytest.raises(UnsupportedConnectionError):
        await client.start_chain(sync_conn, send, Email(to="x"))
    with pytest.raises(UnsupportedConnectionError, match="psycopg"):
        await client.start_chain(object(), send, Email(to="x"))
