"""A job's limit key: given at enqueue, stored by every path, kept or replaced by the
chain's continuations, read back on ``Job``; a key that cannot be one is refused before
any SQL, and the caller's transaction goes on with everything it held."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    Client,
    Continue,
    InvalidOptionError,
    JobTypeRegistry,
    ProcessingMode,
)
from pgwork._limits import MAX_LIMIT_KEY_LENGTH
from pgwork.cli import main
from pgwork.postgres._enqueue import COPY_MIN_ROWS

from .conftest import ClientFactory, scalar

pytestmark = pytest.mark.anyio


class Call(BaseModel):
    n: int


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("call", input=Call, key_concurrency=2, continue_with=["next", "last"])
    reg.job_type("next", input=Call, entry=False, continue_with=["last"])
    reg.job_type("last", input=Call, entry=False)
    reg.job_type("plain", input=Call)  # declares no limit at all
    return reg


async def keys_of(dsn: str, job_ids: list[UUID]) -> list[str | None]:
    """The stored ``limit_key`` of each job, in the order given."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT j.limit_key FROM unnest(%s::uuid[]) WITH ORDINALITY AS i(id, n)"
            " LEFT JOIN pgwork.jobs AS j ON j.id = i.id ORDER BY i.n",
            [job_ids],
        )
        return [row[0] for row in await cur.fetchall()]


# Each enqueue path, from the one statement of a plain start_chain to a streamed COPY:
# each returns the job ids it enqueued, and the keys they must have.
Enqueue = Callable[[Client, psycopg.AsyncConnection[Any]], Awaitable[tuple[list[UUID], list[Any]]]]


async def _plain_start(client: Client, conn: Any) -> tuple[list[UUID], list[Any]]:
    started = await client.start_chain(conn, client.registry.get("call"), Call(n=1), limit_key="k")
    return [started.job_id], ["k"]


async def _scheduled_start(client: Client, conn: Any) -> tuple[list[UUID], list[Any]]:
    call = client.registry.get("call")
    started = await client.start_chain(
        conn, call, Call(n=1), limit_key="k", schedule=timedelta(minutes=5)
    )
    return [started.job_id], ["k"]


async def _deduplicated_start(client: Client, conn: Any) -> tuple[list[UUID], list[Any]]:
    call = client.registry.get("call")
    first = await client.start_chain(conn, call, Call(n=1), limit_key="k", dedup="d")
    again = await client.start_chain(conn, call, Call(n=2), limit_key="other", dedup="d")
    assert again.deduplicated
    assert again.job_id == first.job_id  # the chain that exists, with its own key
    return [first.job_id], ["k"]


async def _small_batch(client: Client, conn: Any) -> tuple[list[UUID], list[Any]]:
    call = client.registry.get("call")
    keys = ["a", None, "b", "a", 'q "u" \\ o'] * 2
    started = await client.start_chains(
        conn, [ChainStart(call, Call(n=i), limit_key=k) for i, k in enumerate(keys)]
    )
    return [s.job_id for s in started], keys


async def _mixed_batch(client: Client, conn: Any) -> tuple[list[UUID], list[Any]]:
    call = client.registry.get("call")
    keys = ["a", None, "b"]
    items = [ChainStart(call, Call(n=i), limit_key=k) for i, k in enumerate(keys)]
    items.append(ChainStart(call, Call(n=9), limit_key="later", schedule=timedelta(hours=1)))
    started = await client.start_chains(conn, items)
    return [s.job_id for s in started], [*keys, "later"]


async def _copied_batch(client: Client, conn: Any) -> tuple[list[UUID], list[Any]]:
    call = client.registry.get("call")
    # Every character COPY's text format escapes, and the text it reads as NULL.
    keys = [None, "tab\there", "new\nline", "back\\slash", "\\N", f"k{COPY_MIN_ROWS}"]
    keys = (keys * (COPY_MIN_ROWS // len(keys) + 1))[: COPY_MIN_ROWS + 10]
    items = [ChainStart(call, Call(n=i), limit_key=k) for i, k in enumerate(keys)]
    # A scheduled job at the end is set aside and inserted after the streamed rows.
    items.append(ChainStart(call, Call(n=-1), limit_key="aside", schedule=timedelta(hours=1)))
    started = await client.start_chains(conn, items)
    return [s.job_id for s in started], [*keys, "aside"]


async def _sync_start(client: Client, conn: Any) -> tuple[list[UUID], list[Any]]:
    # The blocking twins, on a blocking connection of their own (committed here).
    call = client.registry.get("call")
    dsn = conn.info.dsn

    def enqueue() -> list[UUID]:
        with psycopg.connect(dsn) as blocking:
            one = client.start_chain_sync(blocking, call, Call(n=1), limit_key="sync")
            many = client.start_chains_sync(
                blocking, [ChainStart(call, Call(n=i), limit_key=f"s{i}") for i in range(3)]
            )
        return [one.job_id, *(s.job_id for s in many)]

    return await anyio.to_thread.run_sync(enqueue), ["sync", "s0", "s1", "s2"]


PATHS: dict[str, Enqueue] = {
    "start_chain": _plain_start,
    "scheduled": _scheduled_start,
    "dedup": _deduplicated_start,
    "small-batch": _small_batch,
    "mixed-batch": _mixed_batch,
    "copy": _copied_batch,
    "sync": _sync_start,
}


@pytest.mark.parametrize("path", PATHS)
async def test_every_enqueue_path_stores_the_limit_key(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    path: str,
) -> None:
    client = await make_client(registry())
    job_ids, expected = await PATHS[path](client, conn)
    await conn.commit()
    assert await keys_of(pgwork_dsn, job_ids) == expected
    job = await client.get_job(job_ids[0])
    assert job.limit_key == expected[0]


async def test_the_key_is_read_back_by_every_read_of_a_job(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    started = await client.start_chain(
        conn, client.registry.get("call"), Call(n=1), limit_key="tenant-42"
    )
    await conn.commit()
    assert (await client.get_job(started.job_id)).limit_key == "tenant-42"
    assert [j.limit_key for j in (await client.list_jobs()).items] == ["tenant-42"]
    assert [j.limit_key for j in await client.list_chain_jobs(started.id)] == ["tenant-42"]
    assert (await client.get_chain(started.id)).current_job.limit_key == "tenant-42"


async def test_a_key_without_a_key_limit_is_stored_and_a_keyed_type_takes_no_key(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    plain, call = client.registry.get("plain"), client.registry.get("call")
    assert not plain.limited
    assert call.keyed
    stored = await client.start_chain(conn, plain, Call(n=1), limit_key="for later")
    # Jobs of a keyed type without a key share one key of their own: NULL, not refused.
    keyless = await client.start_chain(conn, call, Call(n=2))
    await conn.commit()
    assert await keys_of(pgwork_dsn, [stored.job_id, keyless.job_id]) == ["for later", None]


async def test_the_longest_key_is_stored(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    key = "€" * MAX_LIMIT_KEY_LENGTH
    started = await client.start_chain(conn, client.registry.get("call"), Call(n=1), limit_key=key)
    await conn.commit()
    assert (await client.get_job(started.job_id)).limit_key == key


BAD_KEYS: list[Any] = [
    "",
    "k" * (MAX_LIMIT_KEY_LENGTH + 1),
    "nul\x00key",
    "lone \ud800 surrogate",
    42,
    b"bytes",
    ("a", "tuple"),
]
BAD_IDS = ["empty", "too-long", "nul", "surrogate", "int", "bytes", "tuple"]


async def _bad_start(client: Client, conn: Any, key: Any) -> None:
    await client.start_chain(conn, client.registry.get("call"), Call(n=0), limit_key=key)


async def _bad_scheduled(client: Client, conn: Any, key: Any) -> None:
    call = client.registry.get("call")
    await client.start_chain(conn, call, Call(n=0), limit_key=key, schedule=timedelta(seconds=1))


async def _bad_batch(client: Client, conn: Any, key: Any) -> None:
    # The bad key is in the last item of a batch large enough for COPY.
    call = client.registry.get("call")
    items = [ChainStart(call, Call(n=i), limit_key="fine") for i in range(COPY_MIN_ROWS)]
    await client.start_chains(conn, [*items, ChainStart(call, Call(n=-1), limit_key=key)])


BAD_CALLS = {"start_chain": _bad_start, "scheduled": _bad_scheduled, "batch": _bad_batch}


@pytest.mark.parametrize("call", BAD_CALLS)
@pytest.mark.parametrize("key", BAD_KEYS, ids=BAD_IDS)
async def test_a_bad_key_is_refused_before_any_sql_and_the_transaction_loses_nothing(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    call: str,
    key: Any,
) -> None:
    client = await make_client(registry())
    # The caller's transaction already holds work of its own, and a job.
    await conn.execute("CREATE TABLE callers_own (n int)")
    await conn.execute("INSERT INTO callers_own VALUES (1)")
    before = await client.start_chain(conn, client.registry.get("plain"), Call(n=1))
    with pytest.raises(InvalidOptionError) as caught:
        await BAD_CALLS[call](client, conn, key)
    assert caught.value.option == "limit_key"
    assert str(caught.value).startswith("limit_key must be a non-empty string of at most 200")
    after = await client.start_chain(conn, client.registry.get("plain"), Call(n=2))
    await conn.commit()
    assert await scalar(pgwork_dsn, "SELECT n FROM callers_own") == 1
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 2
    assert await keys_of(pgwork_dsn, [before.job_id, after.job_id]) == [None, None]


@pytest.mark.parametrize("key", BAD_KEYS, ids=BAD_IDS)
async def test_a_bad_key_is_refused_by_the_blocking_twins_before_any_sql(
    make_client: ClientFactory, pgwork_dsn: str, key: Any
) -> None:
    client = await make_client(registry())
    call, plain = client.registry.get("call"), client.registry.get("plain")

    def enqueue() -> None:
        with psycopg.connect(pgwork_dsn) as blocking:
            before = client.start_chain_sync(blocking, plain, Call(n=1))
            with pytest.raises(InvalidOptionError, match=r"^limit_key must be"):
                client.start_chain_sync(blocking, call, Call(n=0), limit_key=key)
            with pytest.raises(InvalidOptionError, match=r"^limit_key must be"):
                client.start_chains_sync(blocking, [ChainStart(call, Call(n=0), limit_key=key)])
            client.start_chain_sync(blocking, plain, Call(n=2))
            blocking.commit()
            assert before.job_id

    await anyio.to_thread.run_sync(enqueue)
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 2


@pytest.mark.parametrize("key", BAD_KEYS, ids=BAD_IDS)
def test_a_continuation_refuses_a_bad_key_where_it_is_built(key: Any) -> None:
    reg = registry()
    with pytest.raises(InvalidOptionError, match=r"^limit_key must be"):
        Continue(reg.get("next"), Call(n=1), limit_key=key)


async def test_a_continuation_keeps_its_jobs_key_unless_it_gives_one(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Handed on from outside a worker (``complete_job``): the next job is built from
    the job as read, and written in the caller's transaction."""
    client = await make_client(registry())
    reg = client.registry
    started = await client.start_chain(conn, reg.get("call"), Call(n=1), limit_key="tenant-1")
    await client.complete_job(
        conn, started.job_id, continue_with=Continue(reg.get("next"), Call(n=2))
    )
    [_, second] = await client.list_chain_jobs(started.id, tx=conn)
    await client.complete_job(
        conn, second.id, continue_with=Continue(reg.get("last"), Call(n=3), limit_key="mail")
    )
    await conn.commit()
    keys = [job.limit_key for job in await client.list_chain_jobs(started.id)]
    assert keys == ["tenant-1", "tenant-1", "mail"]


# A worker hands on in each of its ways: a staged job's hand-on in one statement, an
# atomic attempt's continuation inserted in its transaction, alone or in a group.
MODES: list[tuple[ProcessingMode, int]] = [("staged", 1), ("atomic", 1), ("atomic", 2)]
MODE_IDS = ["staged", "atomic", "atomic-group"]


async def _run_chain(
    client: Client,
    conn: psycopg.AsyncConnection[Any],
    workers: Any,
    atomic_group: int,
    hand_on: Callable[[JobTypeRegistry], Any],
) -> tuple[list[str | None], list[str | None]]:
    """Run a chain of ``first`` (key ``tenant-1``) handing on to ``second`` as
    ``hand_on`` says, on a real worker; return the chain's stored keys and the keys
    its handlers saw on their job."""
    reg = client.registry
    first, second = reg.get("first"), reg.get("second")
    done = anyio.Event()
    seen: list[str | None] = []

    async def start(attempt: Attempt[Call, Any]) -> Any:
        seen.append(attempt.job.limit_key)
        return hand_on(reg)

    async def finish(attempt: Attempt[Call, Any]) -> None:
        seen.append(attempt.job.limit_key)
        done.set()

    await workers(
        client=client, processors={first: start, second: finish}, atomic_group=atomic_group
    )
    started = await client.start_chain(conn, first, Call(n=1), limit_key="tenant-1")
    await conn.commit()
    with anyio.fail_after(20):
        await done.wait()
        await client.await_chain(started.id, timeout=20)
    return [job.limit_key for job in await client.list_chain_jobs(started.id)], seen


def chain_registry(mode: ProcessingMode) -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type(
        "first",
        input=Call,
        mode=mode,
        key_concurrency=1,
        continue_with=["second"],
    )
    reg.job_type("second", input=Call, entry=False, mode=mode)
    return reg


@pytest.mark.parametrize(("mode", "group"), MODES, ids=MODE_IDS)
async def test_a_worker_writes_the_key_a_continuation_gives(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    workers: Any,
    mode: ProcessingMode,
    group: int,
) -> None:
    client = await make_client(chain_registry(mode))
    stored, _ = await _run_chain(
        client,
        conn,
        workers,
        group,
        lambda reg: Continue(reg.get("second"), Call(n=2), limit_key="mail"),
    )
    assert stored == ["tenant-1", "mail"]


@pytest.mark.parametrize(("mode", "group"), MODES, ids=MODE_IDS)
async def test_a_worker_hands_on_the_key_of_the_job_that_continues(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    workers: Any,
    mode: ProcessingMode,
    group: int,
) -> None:
    client = await make_client(chain_registry(mode))
    stored, seen = await _run_chain(
        client, conn, workers, group, lambda reg: Continue(reg.get("second"), Call(n=2))
    )
    assert seen == ["tenant-1", "tenant-1"]  # ``attempt.job.limit_key`` in each handler
    assert stored == ["tenant-1", "tenant-1"]


async def test_pgwork_jobs_show_prints_the_key(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    started = await client.start_chain(
        conn, client.registry.get("call"), Call(n=1), limit_key="tenant-42"
    )
    await conn.commit()
    args = ["jobs", "show", str(started.job_id), "--dsn", pgwork_dsn]
    shown = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(main, args))
    assert shown.exit_code == 0, shown.output
    assert "limit key" in shown.stdout
    assert "tenant-42" in shown.stdout
    as_json = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(main, [*args, "--json"]))
    assert '"limit_key": "tenant-42"' in as_json.stdout
