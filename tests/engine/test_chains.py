"""Chains: continuations (linear, branching, loops), awaiting, blockers and their races."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainNotFoundError,
    ChainStatus,
    Continue,
    JobStatus,
    JobTypeRegistry,
    Notice,
    PostgresNotifyAdapter,
)
from pgwork._ids import new_id
from pgwork.adapters.state import Completion, NewJob
from pgwork.errors import AwaitTimeoutError, ChainFailedError

from .conftest import ClientFactory, acquired_job, scalar

pytestmark = pytest.mark.anyio


class Count(BaseModel):
    n: int


class Word(BaseModel):
    text: str


def countdown_registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("countdown", input=Count, output=Word, continue_with=["countdown", "even", "odd"])
    reg.job_type("even", input=Count, output=Word, entry=False)
    reg.job_type("odd", input=Count, output=Word, entry=False)
    return reg


async def test_loops_and_branches_then_await_chain_returns_the_final_output(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(countdown_registry())
    countdown, even, odd = (client.registry.get(n) for n in ("countdown", "even", "odd"))

    async def handle_countdown(attempt: Attempt[Count, Word]) -> Continue[Count]:
        n = attempt.job.input.n
        if n > 3:  # loop: the same type again
            return Continue(countdown, Count(n=n - 1))
        return Continue(even if n % 2 == 0 else odd, Count(n=n))  # branch at run time

    async def handle_even(attempt: Attempt[Count, Word]) -> Word:
        return Word(text=f"even {attempt.job.input.n}")

    async def handle_odd(attempt: Attempt[Count, Word]) -> Word:
        return Word(text=f"odd {attempt.job.input.n}")

    await workers(
        client=client,
        processors={countdown: handle_countdown, even: handle_even, odd: handle_odd},
    )
    started = await client.start_chain(conn, countdown, Count(n=6))
    await conn.commit()
    assert await client.await_chain(started.id, timeout=30) == Word(text="odd 3")
    jobs = await client.list_chain_jobs(started.id)
    assert [(j.type_name, j.input.n) for j in jobs] == [
        ("countdown", 6),
        ("countdown", 5),
        ("countdown", 4),
        ("countdown", 3),
        ("odd", 3),
    ]
    assert [j.chain_index for j in jobs] == [0, 1, 2, 3, 4]
    chain = await client.get_chain(started.id)
    assert chain.status is ChainStatus.COMPLETED
    assert chain.current_job.type_name == "odd"


async def test_await_chain_raises_when_the_chain_fails(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    doomed = reg.job_type("doomed", input=Count, max_attempts=1)
    client = await make_client(reg)

    async def handle(attempt: Attempt[Count, Any]) -> None:
        raise RuntimeError("no luck")

    await workers(client=client, processors={doomed: handle})
    started = await client.start_chain(conn, doomed, Count(n=1))
    await conn.commit()
    with pytest.raises(ChainFailedError, match="no luck") as err:
        await client.await_chain(started.id, timeout=30)
    assert err.value.status == "failed"


async def test_await_chain_gives_up_after_its_timeout(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    idle = reg.job_type("idle", input=Count)
    client = await make_client(reg)
    started = await client.start_chain(conn, idle, Count(n=1))
    await conn.commit()
    with pytest.raises(AwaitTimeoutError) as err:
        await client.await_chain(started.id, timeout=0.3)
    assert isinstance(err.value, TimeoutError)
    assert err.value.chain_id == started.id


def fan_in_registry(policy: str = "fail") -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("fetch", input=Word, output=Count, max_attempts=1)
    reg.job_type("merge", input=Word, output=Word, blocker_failure=policy)  # type: ignore[arg-type]
    return reg


async def test_a_job_blocked_on_chains_runs_after_all_complete_and_sees_their_outputs(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(fan_in_registry())
    fetch, merge = client.registry.get("fetch"), client.registry.get("merge")
    seen: list[list[Any]] = []

    async def handle_fetch(attempt: Attempt[Word, Count]) -> Count:
        return Count(n=len(attempt.job.input.text))

    async def handle_merge(attempt: Attempt[Word, Word]) -> Word:
        outputs = await attempt.blocker_outputs()
        seen.append(outputs)
        return Word(text=f"{attempt.job.input.text}={sum(o.n for o in outputs)}")

    a = await client.start_chain(conn, fetch, Word(text="abc"))
    b = await client.start_chain(conn, fetch, Word(text="hello"))
    merged = await client.start_chain(conn, merge, Word(text="total"), blockers=[a, b.id])
    await conn.commit()
    assert merged.status is JobStatus.BLOCKED
    await workers(client=client, processors={fetch: handle_fetch, merge: handle_merge})
    assert await client.await_chain(merged.id, timeout=30) == Word(text="total=8")
    assert seen == [[Count(n=3), Count(n=5)]]


@pytest.mark.parametrize(
    ("policy", "expected_status", "runs"),
    [
        ("fail", JobStatus.FAILED, 0),
        ("cancel", JobStatus.CANCELLED, 0),
        ("unblock", JobStatus.COMPLETED, 1),
    ],
)
async def test_a_failed_blocker_applies_the_dependants_policy(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    policy: str,
    expected_status: JobStatus,
    runs: int,
) -> None:
    client = await make_client(fan_in_registry(policy))
    fetch, merge = client.registry.get("fetch"), client.registry.get("merge")
    merge_runs: list[list[Any]] = []

    async def handle_fetch(attempt: Attempt[Word, Count]) -> Count:
        raise ValueError("source down")

    async def handle_merge(attempt: Attempt[Word, Word]) -> Word:
        merge_runs.append(await attempt.blocker_outputs())
        return Word(text="partial")

    blocker = await client.start_chain(conn, fetch, Word(text="x"))
    dependant = await client.start_chain(conn, merge, Word(text="y"), blockers=[blocker])
    await conn.commit()
    await workers(client=client, processors={fetch: handle_fetch, merge: handle_merge})

    async def settled() -> bool:
        return (await client.get_job(dependant.job_id)).status is expected_status

    from .conftest import eventually

    await eventually(settled, what=f"dependant {expected_status}")
    assert len(merge_runs) == runs
    if runs:
        assert merge_runs == [[None]]
    else:
        job = await client.get_job(dependant.job_id)
        assert job.last_attempt_error is not None
        assert str(blocker.id) in job.last_attempt_error.message


async def test_blocking_on_a_chain_that_does_not_exist_names_it(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(fan_in_registry())
    from pgwork._ids import new_id

    ghost = new_id()
    with pytest.raises(ChainNotFoundError) as err:
        await client.start_chain(
            conn, client.registry.get("merge"), Word(text="y"), blockers=[ghost]
        )
    assert err.value.chain_ids == (ghost,)
    await conn.rollback()


async def test_a_missing_blocker_leaves_the_others_untouched_while_the_transaction_goes_on(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """The enqueue is refused before anything is written: the blocker that exists is
    neither locked (a worker takes it while the caller's transaction stays open) nor
    marked as having a dependant once that transaction commits."""
    client = await make_client(fan_in_registry())
    fetch, merge = client.registry.get("fetch"), client.registry.get("merge")
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as setup:
        real = await client.start_chain(setup, fetch, Word(text="x"))
        await setup.commit()

    with pytest.raises(ChainNotFoundError) as err:
        await client.start_chain(conn, merge, Word(text="y"), blockers=[real, new_id()])
    assert real.id not in err.value.chain_ids
    taken = await client.state.acquire(
        worker_id="w", leases={"fetch": timedelta(seconds=60)}, queues=None, limit=1
    )
    assert [job.id for job in taken] == [real.id]
    await conn.commit()
    assert not await scalar(
        pgwork_dsn, "SELECT chain_has_dependants FROM pgwork.jobs WHERE id = %s", real.id
    )


async def test_a_blocker_ending_while_its_dependant_is_enqueued_never_strands_it(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    """Enqueue a dependant and complete its blocker in two concurrent transactions, many
    times: whichever commits first, the dependant must end up pending, never blocked."""
    client = await make_client(fan_in_registry())
    fetch, merge = client.registry.get("fetch"), client.registry.get("merge")
    dependants = []
    for round_ in range(15):
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as setup:
            blocker = await client.start_chain(setup, fetch, Word(text=str(round_)))
            await setup.commit()
        async with (
            await psycopg.AsyncConnection.connect(pgwork_dsn) as enqueue_conn,
            await psycopg.AsyncConnection.connect(pgwork_dsn) as complete_conn,
        ):

            async def enqueue(blocker: Any, pause: float) -> None:
                started = await client.start_chain(
                    enqueue_conn, merge, Word(text="d"), blockers=[blocker]
                )
                dependants.append(started.job_id)
                await anyio.sleep(pause)
                await enqueue_conn.commit()

            async def complete(blocker: Any, pause: float) -> None:
                await anyio.sleep(pause)
                await client.complete_job(complete_conn, blocker.job_id, Count(n=1))
                await complete_conn.commit()

            async with anyio.create_task_group() as tg:
                tg.start_soon(enqueue, blocker, 0.001 * (round_ % 3))
                tg.start_soon(complete, blocker, 0.001 * (round_ % 4))
    statuses = [(await client.get_job(job_id)).status for job_id in dependants]
    assert statuses == [JobStatus.PENDING] * 15


async def test_two_blockers_ending_at_once_unblock_their_common_dependant(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(fan_in_registry())
    fetch, merge = client.registry.get("fetch"), client.registry.get("merge")
    outcomes = []
    for _ in range(10):
        a = await client.start_chain(conn, fetch, Word(text="a"))
        b = await client.start_chain(conn, fetch, Word(text="b"))
        d = await client.start_chain(conn, merge, Word(text="d"), blockers=[a, b])
        await conn.commit()

        async def finish(job_id: Any) -> None:
            async with await psycopg.AsyncConnection.connect(pgwork_dsn) as c:
                await client.complete_job(c, job_id, Count(n=1))
                await c.commit()

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish, a.job_id)
            tg.start_soon(finish, b.job_id)
        outcomes.append((await client.get_job(d.job_id)).status)
    assert outcomes == [JobStatus.PENDING] * 10


async def test_a_delayed_continuation_waits_for_its_time(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    first = reg.job_type("first", input=Count, continue_with=["later"])
    later = reg.job_type("later", input=Count, entry=False)
    client = await make_client(reg)

    async def handle_first(attempt: Attempt[Count, Any]) -> Continue[Count]:
        return Continue(later, Count(n=1), after=timedelta(hours=1))

    async def handle_later(attempt: Attempt[Count, Any]) -> None:
        return None

    await workers(client=client, processors={first: handle_first, later: handle_later})
    started = await client.start_chain(conn, first, Count(n=0))
    await conn.commit()

    async def continued() -> bool:
        return len(await client.list_chain_jobs(started.id)) == 2

    from .conftest import eventually

    await eventually(continued, what="continuation inserted")
    nxt = (await client.list_chain_jobs(started.id))[1]
    assert nxt.status is JobStatus.PENDING
    assert nxt.scheduled_at - nxt.created_at >= timedelta(minutes=59)


async def test_a_hand_on_announces_its_continuation_on_the_database_channel(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    # A worker's hand-on is one statement: it completes the job, inserts the next one
    # and, with PostgreSQL's own notify adapter, sends the ready notice with them.
    client, job = await acquired_job(make_client, conn)
    following = NewJob(
        id=new_id(),
        type_name=job.type_name,
        chain_id=job.chain_id,
        chain_type_name=job.chain_type_name,
        chain_index=1,
        input_json='{"n": 2}',
        queue=job.queue,
        priority=0,
        max_attempts=3,
    )
    handed_on = Completion(job.id, job.lease_token, "null", following)
    assert isinstance(client.notify, PostgresNotifyAdapter)
    async with client.notify.listen() as listener:
        [result] = await client.state.complete(None, completions=[handed_on], notify=client.notify)
        assert result.accepted
        notices = await listener.wait(5.0)
        notices += await listener.wait(0.3)
    assert notices == [Notice(kind="ready", queue=job.queue)]
    assert (
        await scalar(
            pgwork_dsn, f"SELECT status::text FROM pgwork.jobs WHERE id = '{following.id}'"
        )
        == "pending"
    )
