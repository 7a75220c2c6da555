"""Options out of their column's range are refused before any SQL runs.

Each would otherwise reach PostgreSQL and fail with a driver error that also aborts
the caller's transaction; the control in each test is that the same transaction can
still insert and commit afterwards.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    Continue,
    DedupSpec,
    InvalidOptionError,
    JobStatus,
    JobTypeRegistry,
    PayloadNotSerializableError,
    PayloadTooDeepError,
    PostgresStateAdapter,
    RetryPolicy,
    create_client,
    create_in_process_worker,
)
from pgwork._limits import MAX_ATOMIC_DEADLINE

from .conftest import ClientFactory, scalar

pytestmark = pytest.mark.anyio


class Note(BaseModel):
    text: str


BAD_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("priority", {"priority": 40000}),
    ("priority", {"priority": -40000}),
    ("priority", {"priority": 1.5}),
    ("max_attempts", {"max_attempts": 10**12}),
    ("max_attempts", {"max_attempts": 0}),
    ("queue", {"queue": ""}),
    ("queue", {"queue": " padded"}),
    ("queue", {"queue": "tab\there"}),
    ("queue", {"queue": "q" * 129}),
    ("schedule", {"schedule": timedelta.max}),
    ("dedup", {"dedup": "nul\x00key"}),
    ("dedup", {"dedup": 42}),
    ("dedup window", {"dedup": DedupSpec("k", scope="window", window=timedelta.max)}),
    # Past what a btree index entry holds (about 2.7 kB): the insert would fail.
    ("dedup", {"dedup": "k" * 3000}),
    ("dedup", {"dedup": "k" * 1025}),
    ("dedup", {"dedup": "€" * 342}),
    ("dedup", {"dedup": "lone \ud800 surrogate"}),
    ("context", {"context": {"k": "lone \ud800 surrogate"}}),
    # Stored, they would be read back after the year 9999 in some time zone (UTC+14):
    # every later read of the job would fail.
    ("schedule", {"schedule": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))}),
    ("schedule", {"schedule": datetime(9999, 12, 31, tzinfo=UTC)}),
]

BAD_IDS = [f"{option}-{i}" for i, (option, _) in enumerate(BAD_OPTIONS)]


@pytest.mark.parametrize(("option", "kwargs"), BAD_OPTIONS, ids=BAD_IDS)
async def test_out_of_range_option_is_named_and_leaves_the_transaction_usable(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    option: str,
    kwargs: dict[str, Any],
) -> None:
    reg = JobTypeRegistry()
    note = reg.job_type("note", input=Note)
    client = await make_client(reg)
    with pytest.raises(InvalidOptionError) as caught:
        await client.start_chain(conn, note, Note(text="x"), **kwargs)
    assert caught.value.option == option
    assert str(caught.value).startswith(option)
    # The caller's transaction is still usable: insert and commit in it.
    started = await client.start_chain(conn, note, Note(text="after"))
    await conn.commit()
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs WHERE id = %s", started.id)


async def test_start_chains_checks_every_item_before_inserting_any(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    note = reg.job_type("note", input=Note)
    client = await make_client(reg)
    items = [ChainStart(note, Note(text="ok")), ChainStart(note, Note(text="x"), priority=40000)]
    with pytest.raises(InvalidOptionError, match="priority must be an integer from -32768"):
        await client.start_chains(conn, items)
    await conn.commit()
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 0


async def test_options_at_the_edges_of_their_range_are_stored(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    note = reg.job_type("note", input=Note)
    client = await make_client(reg)
    started = await client.start_chain(
        conn, note, Note(text="x"), priority=32767, max_attempts=2**31 - 1, queue="a | b c"
    )
    await conn.commit()
    job = await client.get_job(started.job_id)
    assert (job.priority, job.max_attempts, job.queue) == (32767, 2**31 - 1, "a | b c")


async def test_the_longest_dedup_key_and_latest_schedule_are_stored_and_read_everywhere(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    note = reg.job_type("note", input=Note)
    client = await make_client(reg)
    key = "€" * 341 + "k"  # 1024 bytes in UTF-8
    latest = datetime(9999, 12, 30, tzinfo=UTC)
    started = await client.start_chain(conn, note, Note(text="x"), dedup=key, schedule=latest)
    await conn.commit()
    # Read back in the session time zone furthest ahead of UTC, by get_job and a listing.
    await conn.execute("SET TIME ZONE 'Pacific/Kiritimati'")
    job = await client.get_job(started.job_id, tx=conn)
    assert (job.scheduled_at, job.dedup_key) == (latest, key)
    listed = await client.list_jobs(tx=conn)
    assert [j.id for j in listed.items] == [started.job_id]
    await conn.commit()


async def test_a_chain_listed_twice_as_a_blocker_is_waited_for_once(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    note = reg.job_type("note", input=Note)
    client = await make_client(reg)
    first = await client.start_chain(conn, note, Note(text="first"))
    waiting = await client.start_chain(conn, note, Note(text="then"), blockers=[first, first.id])
    await conn.commit()
    assert waiting.status == JobStatus.BLOCKED
    edges = "SELECT count(*) FROM pgwork.job_blockers WHERE job_id = %s"
    assert await scalar(pgwork_dsn, edges, waiting.job_id) == 1
    await client.complete_job(conn, first.job_id, None)
    await conn.commit()
    assert (await client.get_job(waiting.job_id)).status == JobStatus.PENDING


@pytest.mark.parametrize(
    ("option", "kwargs"),
    [
        ("priority", {"priority": 40000}),
        ("max_attempts", {"max_attempts": 10**12}),
        ("queue", {"queue": ""}),
        ("queue", {"queue": "trailing "}),
    ],
)
def test_job_type_declaration_checks_the_same_ranges(option: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobTypeRegistry().job_type("note", input=Note, **kwargs)
    assert caught.value.option == option
    assert "job type 'note'" in str(caught.value)


async def test_a_worker_refuses_a_queue_name_no_job_could_have(make_client: ClientFactory) -> None:
    reg = JobTypeRegistry()
    note = reg.job_type("note", input=Note)
    client = await make_client(reg)
    with pytest.raises(InvalidOptionError, match="queue of the worker's queues"):
        create_in_process_worker(client=client, processors={note: print}, queues=["default "])


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


class Tree(BaseModel):
    data: Any


@pytest.mark.parametrize("depth", [300, 1_000, 5_000])
async def test_a_deeply_nested_input_is_refused_by_name_not_by_recursion(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], depth: int
) -> None:
    reg = JobTypeRegistry()
    tree = reg.job_type("tree", input=Tree)
    client = await make_client(reg)
    with pytest.raises(PayloadTooDeepError, match="nested more than 255 levels deep"):
        await client.start_chain(conn, tree, {"data": nested(depth)})
    # The control: a deep but encodable input is stored and read back whole.
    started = await client.start_chain(conn, tree, Tree(data=nested(200)))
    await conn.commit()
    assert (await client.get_job(started.job_id)).input == Tree(data=nested(200))


DAYS_25 = timedelta(days=25)

UNRUNNABLE_DECLARATIONS: list[tuple[str, dict[str, Any]]] = [
    # An atomic attempt's transaction is bounded by a server setting in milliseconds,
    # which holds up to 2**31 - 1 (24.8 days): past it every attempt failed to begin.
    ("timeout", {"mode": "atomic", "timeout": DAYS_25}),
    ("lease", {"mode": "atomic", "lease": DAYS_25}),
    # Past what the database clock can add (a lease, a timeout) or take (retention).
    ("lease", {"lease": timedelta.max}),
    ("timeout", {"timeout": timedelta.max}),
    ("abandon_after", {"abandon_after": timedelta.max}),
    ("retention", {"retention": timedelta.max}),
]


@pytest.mark.parametrize(
    ("option", "kwargs"),
    UNRUNNABLE_DECLARATIONS,
    ids=[f"{option}-{i}" for i, (option, _) in enumerate(UNRUNNABLE_DECLARATIONS)],
)
def test_a_duration_no_attempt_could_run_with_is_refused_at_declaration(
    option: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobTypeRegistry().job_type("note", input=Note, **kwargs)
    assert caught.value.option == option


def test_a_retry_delay_past_the_database_clock_is_refused() -> None:
    with pytest.raises(InvalidOptionError) as caught:
        RetryPolicy(maximum=timedelta.max)
    assert caught.value.option == "RetryPolicy.maximum"


def test_a_staged_type_keeps_a_long_lease_and_an_atomic_one_a_long_lease_with_a_timeout() -> None:
    reg = JobTypeRegistry()
    reg.job_type("staged", input=Note, lease=DAYS_25, timeout=DAYS_25)
    # The lease is not an atomic attempt's deadline when it has a timeout.
    reg.job_type("atomic", input=Note, mode="atomic", lease=DAYS_25, timeout=timedelta(hours=1))


async def test_an_atomic_job_with_the_longest_timeout_runs(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    longest = reg.job_type(
        "longest", input=Note, output=Note, mode="atomic", timeout=MAX_ATOMIC_DEADLINE
    )
    client = await make_client(reg)

    async def handle(attempt: Attempt[Note, Note]) -> Note:
        return attempt.job.input

    await workers(client=client, processors={longest: handle})
    started = await client.start_chain(conn, longest, Note(text="done"))
    await conn.commit()
    assert await client.await_chain(started.id, timeout=20) == Note(text="done")
    assert (await client.get_job(started.job_id)).attempt == 1


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("poll_interval", float("nan")),
        ("dead_worker_after", float("inf")),
        ("heartbeat_interval", 1e300),
        ("grace_period", timedelta.max),
        ("abandon_after", "5"),
    ],
)
async def test_a_worker_refuses_a_duration_it_could_not_wait_for(
    make_client: ClientFactory, option: str, value: Any
) -> None:
    reg = JobTypeRegistry()
    note = reg.job_type("note", input=Note)
    client = await make_client(reg)
    with pytest.raises(InvalidOptionError) as caught:
        create_in_process_worker(client=client, processors={note: print}, **{option: value})
    assert caught.value.option == option


async def test_a_lone_surrogate_in_an_input_is_named_by_its_path(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    note = reg.job_type("note", input=Note)
    client = await make_client(reg)
    with pytest.raises(PayloadNotSerializableError) as caught:
        await client.start_chain(conn, note, Note(text="lone \ud800"))
    assert caught.value.path == "$.text"
    await client.start_chain(conn, note, Note(text="after"))
    await conn.commit()


def test_a_continuation_delay_past_the_database_clock_is_refused_where_it_is_built() -> None:
    note = JobTypeRegistry().job_type("note", input=Note)
    with pytest.raises(InvalidOptionError) as caught:
        Continue(note, Note(text="x"), after=timedelta.max)
    assert caught.value.option == "after"


async def test_a_payload_cap_past_what_jsonb_holds_is_refused(pgwork_dsn: str) -> None:
    state = await PostgresStateAdapter.connect(pgwork_dsn)
    try:
        with pytest.raises(InvalidOptionError) as caught:
            create_client(state_adapter=state, registry=JobTypeRegistry(), max_payload_bytes=2**28)
        assert caught.value.option == "max_payload_bytes"
    finally:
        await state.close()
