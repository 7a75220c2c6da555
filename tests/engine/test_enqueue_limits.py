"""Options out of their column's range are refused before any SQL runs.

Each would otherwise reach PostgreSQL and fail with a driver error that also aborts
the caller's transaction; the control in each test is that the same transaction can
still insert and commit afterwards.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    ChainStart,
    DedupSpec,
    InvalidOptionError,
    JobTypeRegistry,
    PayloadTooDeepError,
    create_in_process_worker,
)

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
