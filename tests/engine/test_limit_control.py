"""Flow limits changed at run time through the client: overrides read back over the
declaration, bad changes refused before any statement, a raised limit starting the
waiting jobs within a notification, and an attempt pausing its own key.

``test_a_paused_key_starts_nothing_until_resumed`` needs the acquire to honour
``paused_until`` (``postgres/sql/limits.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel
from tests.engine.conftest import ClientFactory, HangUntilAborted, eventually, scalar

from pgwork import (
    ChainStart,
    InvalidOptionError,
    JobTypeRegistry,
    LimitNotDeclaredError,
    Limits,
    Rate,
)
from pgwork.errors import ConfigurationError

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    n: int


SECOND = timedelta(seconds=1)


def _registry() -> tuple[JobTypeRegistry, Any, Any, Any]:
    reg = JobTypeRegistry()
    keyed = reg.job_type(
        "call", input=Item, concurrency=4, key_concurrency=2, key_rate=Rate(100, per=SECOND)
    )
    whole = reg.job_type("export", input=Item, concurrency=1)
    plain = reg.job_type("plain", input=Item)
    return reg, keyed, whole, plain


async def _enqueue(client: Any, conn: Any, job_type: Any, keys: list[str | None]) -> None:
    await client.start_chains(
        conn, [ChainStart(job_type, Item(n=n), limit_key=key) for n, key in enumerate(keys)]
    )
    await conn.commit()


async def test_an_override_reads_back_over_the_declaration(make_client: ClientFactory) -> None:
    """Set, keep (left out), reset (None): the effective limit follows; a key's own
    limit shows on that key alone."""
    reg, keyed, _, _ = _registry()
    client = await make_client(reg)
    await client.set_limits(keyed, concurrency=8, rate=Rate(5, per=timedelta(seconds=1)))
    await client.set_limits("call", key="tenant-1", key_concurrency=1)
    await client.set_limits(keyed, concurrency=None)

    [status] = await client.limits(job_type=keyed)
    assert status.declared == Limits(
        concurrency=4, key_concurrency=2, key_rate=Rate(100, per=SECOND)
    )
    assert status.override == Limits(rate=Rate(5, per=SECOND))
    assert status.effective == Limits(
        concurrency=4, key_concurrency=2, rate=Rate(5, per=SECOND), key_rate=Rate(100, per=SECOND)
    )
    assert [(k.limit_key, k.key_concurrency) for k in status.keys] == [("tenant-1", 1)]
    assert [s.type_name for s in await client.limits()] == ["call", "export"]


async def test_bad_changes_are_refused_before_any_statement(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Each refusal names what is wrong, and the caller's transaction goes on."""
    reg, keyed, whole, plain = _registry()
    client = await make_client(reg)
    soon = datetime.now(UTC) + timedelta(minutes=1)
    refused: list[tuple[Any, type[Exception]]] = [
        (client.set_limits(keyed, concurrency=0, tx=conn), InvalidOptionError),
        (client.set_limits(keyed, concurrency=10_001, tx=conn), InvalidOptionError),
        (client.set_limits(keyed, rate=10, tx=conn), InvalidOptionError),
        (client.set_limits(keyed, tx=conn), ConfigurationError),
        (client.set_limits(keyed, key="t", concurrency=3, tx=conn), InvalidOptionError),
        (client.set_limits(keyed, key="", key_concurrency=3, tx=conn), InvalidOptionError),
        (client.set_limits(whole, key="t", key_concurrency=3, tx=conn), LimitNotDeclaredError),
        (client.set_limits(whole, key_concurrency=3, tx=conn), LimitNotDeclaredError),
        (client.set_limits(plain, concurrency=3, tx=conn), LimitNotDeclaredError),
        (client.set_limits(whole, rate=Rate(1, per=SECOND), tx=conn), LimitNotDeclaredError),
        (client.set_limits("nobody", concurrency=3, tx=conn), LimitNotDeclaredError),
        (client.pause_limits(keyed, until=soon.replace(tzinfo=None), tx=conn), InvalidOptionError),
        (client.pause_limits(keyed, until=soon - timedelta(hours=1), tx=conn), InvalidOptionError),
        (client.pause_limits(keyed, after=timedelta(0), tx=conn), InvalidOptionError),
        (client.pause_limits(keyed, tx=conn), InvalidOptionError),
        (client.pause_limits(whole, key="t", after=timedelta(1), tx=conn), LimitNotDeclaredError),
        (client.pause_limits(plain, after=timedelta(1), tx=conn), LimitNotDeclaredError),
    ]
    for call, error in refused:
        with pytest.raises(error):
            await call
    await client.start_chain(conn, keyed, Item(n=1))
    await conn.commit()
    [status] = await client.limits(job_type=keyed)
    assert (status.override, status.paused_until, status.pending) == (Limits(), None, 1)


async def test_a_rate_is_refused_on_a_type_that_declares_none(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A worker records starts only for the types that declare a rate, so a rate set at
    run time over a type without one would never bind: it is refused, naming the
    reason, and the caller's transaction goes on. A reset of it is not refused."""
    reg, keyed, whole, _ = _registry()
    client = await make_client(reg)
    with pytest.raises(LimitNotDeclaredError, match="declares no rate") as refused:
        await client.set_limits(whole, rate=Rate(1, per=SECOND), tx=conn)
    assert refused.value.reason == "unrated"
    await client.set_limits(whole, rate=None, tx=conn)
    await client.set_limits(keyed, rate=Rate(5, per=SECOND), tx=conn)  # it declares a key rate
    await conn.commit()
    statuses = {s.type_name: s for s in await client.limits()}
    assert statuses["export"].override == Limits()
    assert statuses["call"].override == Limits(rate=Rate(5, per=SECOND))


async def test_a_change_in_the_callers_transaction_is_kept_only_if_it_commits(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg, keyed, _, _ = _registry()
    client = await make_client(reg)
    await client.pause_limits(keyed, key="t", after=timedelta(hours=1), tx=conn)
    await conn.rollback()
    [status] = await client.limits(job_type=keyed)
    assert status.keys == ()
    await client.pause_limits(keyed, key="t", after=timedelta(hours=1), tx=conn)
    await conn.commit()
    [status] = await client.limits(job_type=keyed)
    assert [(k.limit_key, k.paused) for k in status.keys] == [("t", True)]
    await client.resume_limits(keyed, key="t")
    [status] = await client.limits(job_type=keyed)
    assert status.keys == ()


async def test_limits_counts_what_runs_and_waits_and_ranks_the_keys(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Two of ``a`` run at its key limit of two, one of ``b``; four run in all, the
    type's limit, and the rest wait: ``a`` is the key closest to its limit."""
    reg, keyed, _, _ = _registry()
    client = await make_client(reg)
    handler = HangUntilAborted()
    await _enqueue(client, conn, keyed, ["a"] * 4 + ["b"] + [None] * 2)
    await workers(client=client, processors={keyed: handler}, max_slots=10, grace_period=0.5)

    async def four_run() -> bool:
        [status] = await client.limits(job_type=keyed)
        return status.running == 4

    await eventually(four_run, what="four calls running")
    [status] = await client.limits(job_type=keyed)
    assert (status.running, status.pending) == (4, 3)
    assert [(k.limit_key, k.running, k.pending) for k in status.keys] == [
        ("a", 2, 2),
        (None, 1, 1),
        ("b", 1, 0),
    ]


async def test_a_client_without_the_type_knows_it_from_the_workers_registration(
    make_client: ClientFactory, workers: Any
) -> None:
    """The command line's client has an empty registry: what a registered worker
    declares is what it checks against and shows. Control: a worker that records no
    declaration leaves the type unknown (the first refusal below)."""
    reg, keyed, _whole, plain = _registry()
    operator = await make_client(JobTypeRegistry())
    with pytest.raises(LimitNotDeclaredError, match="no flow limits are known"):
        await operator.set_limits("call", concurrency=2)
    client = await make_client(reg)
    await workers(
        client=client,
        processors={keyed: HangUntilAborted(), plain: HangUntilAborted()},
        grace_period=0.5,
    )

    await operator.set_limits("call", key="t", key_concurrency=1)
    with pytest.raises(LimitNotDeclaredError, match="declares no flow limit"):
        await operator.set_limits("plain", concurrency=2)
    [status] = await operator.limits(job_type="call")
    assert status.declared == Limits(
        concurrency=4, key_concurrency=2, key_rate=Rate(100, per=SECOND)
    )
    assert status.keys[0].key_concurrency == 1
    # A reset needs no declaration: an override of a type gone can still be lifted.
    await operator.set_limits("gone", concurrency=None)


async def test_a_raised_limit_starts_waiting_jobs_within_a_notification(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """One export runs at its limit of one, two wait; the worker polls once a minute.
    Raised to three, the two start at once. Control: without the ready notice after
    the change (``_announce`` publishing nothing) they wait for the poll."""
    reg, _, whole, _ = _registry()
    client = await make_client(reg)
    handler = HangUntilAborted()
    await _enqueue(client, conn, whole, [None] * 3)
    await workers(
        client=client, processors={whole: handler}, max_slots=5, poll_interval=60, grace_period=0.5
    )
    await handler.running.wait()

    async def running(n: int) -> Any:
        async def check() -> bool:
            [status] = await client.limits(job_type=whole)
            return status.running == n

        return check

    await eventually(await running(1), what="one export running")
    await anyio.sleep(0.3)  # the worker's acquire came back short: it waits to be woken
    await client.set_limits(whole, concurrency=3)
    await eventually(await running(3), timeout=5.0, what="three exports running")


async def test_an_attempt_pauses_its_key_and_reschedules_itself(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """ "429, retry after": ``throttle`` pauses the job's key on the store (in a
    transaction of its own: an atomic attempt rolling back keeps it) and puts the job
    back without counting the attempt."""
    reg = JobTypeRegistry()
    call = reg.job_type("call", input=Item, key_concurrency=2, mode="atomic", max_attempts=1)
    client = await make_client(reg)
    throttled = anyio.Event()

    async def handler(attempt: Any) -> None:
        await attempt.throttle(after=timedelta(minutes=5))
        throttled.set()
        raise RuntimeError("the atomic attempt's transaction rolls back")

    await _enqueue(client, conn, call, ["tenant-1"])
    await workers(client=client, processors={call: handler})
    with anyio.fail_after(10):
        await throttled.wait()
    [status] = await client.limits(job_type=call)
    assert [(k.limit_key, k.paused) for k in status.keys] == [("tenant-1", True)]
    left = status.keys[0].paused_until - status.now  # type: ignore[operator]
    assert timedelta(minutes=4) < left <= timedelta(minutes=5)


async def test_an_attempt_of_a_type_without_limits_cannot_pause(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    plain = reg.job_type("plain", input=Item, max_attempts=1)
    client = await make_client(reg)
    raised: list[BaseException] = []
    done = anyio.Event()

    async def handler(attempt: Any) -> None:
        try:
            await attempt.throttle(after=timedelta(seconds=30))
        except LimitNotDeclaredError as exc:
            raised.append(exc)
        done.set()

    await _enqueue(client, conn, plain, [None])
    await workers(client=client, processors={plain: handler})
    with anyio.fail_after(10):
        await done.wait()
    assert len(raised) == 1
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.job_limits") == 0


async def test_a_paused_key_starts_nothing_until_resumed(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A key paused for an hour: the other key's jobs run, its own wait; resumed, they
    start within a notification (the worker polls once a minute)."""
    reg, keyed, _, _ = _registry()
    client = await make_client(reg)
    handler = HangUntilAborted()
    await client.pause_limits(keyed, key="a", after=timedelta(hours=1))
    await _enqueue(client, conn, keyed, ["a", "b"])
    await workers(client=client, processors={keyed: handler}, poll_interval=60, grace_period=0.5)

    async def running(expected: dict[str | None, int]) -> Any:
        async def check() -> bool:
            [status] = await client.limits(job_type=keyed)
            return {k.limit_key: k.running for k in status.keys if k.running} == expected

        return check

    await eventually(await running({"b": 1}), what="b running")
    await anyio.sleep(1.0)
    assert await (await running({"b": 1}))()
    await client.resume_limits(keyed, key="a")
    await eventually(await running({"a": 1, "b": 1}), timeout=5.0, what="a running")
