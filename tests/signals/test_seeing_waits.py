"""What a waiting chain shows: ``client.waiting`` says what its current step waits for
(a signal, a time, a debounce, blocker chains), ``list_waiting`` and ``list_signals``
list them, and ``await_chain`` gives up saying what the chain waits for.

A signal wait is the match's own rule (``sql.signals.step_waits``): a step whose
timeout has passed no longer waits, whether or not a worker has started it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from pydantic import BaseModel
from tests.fan_out._kit import Batch, FanOut, start, statuses

from pgwork import Continue, Debounce, JobTypeRegistry, WaitKind
from pgwork.errors import AwaitTimeoutError, ConfigurationError, InvalidCursorError

from ._kit import Order, Shipments, Shop, send, start_order, waiting

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PROMPT = 10.0
DAY = timedelta(days=1)


async def _shop(make_client: Any, workers: Any, *, ship: bool = True) -> tuple[Any, Shop, Any]:
    """A client and a worker that runs ``order`` (and ``ship``, if asked): without a
    ``ship`` processor a step that stops waiting stays pending, not started."""
    shop = Shop()
    client = await make_client(shop.registry)
    shipments = Shipments(shop.payment)
    processors: dict[Any, Any] = {shop.order: shop.hand_on}
    if ship:
        processors[shop.ship] = shipments
    await workers(client=client, processors=processors)
    return client, shop, shipments


async def test_a_chain_waiting_for_a_signal_says_which_and_until_when(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    client, shop, shipments = await _shop(make_client, workers)
    chain = await start_order(pgwork_dsn, client, shop, Order(id="o-1", timeout_s=2 * 86400))
    await waiting(pgwork_dsn, 1)

    found = await client.waiting(chain)

    assert found is not None
    assert found.kind is WaitKind.SIGNAL
    assert (found.chain_id, found.chain_type_name, found.type_name) == (chain, "order", "ship")
    assert found.signal == "payment:o-1"
    assert found.until is not None
    assert timedelta(days=2) - timedelta(minutes=1) < found.until - found.as_of <= 2 * DAY
    assert found.since <= found.as_of
    assert found.describe() == "signal 'payment:o-1' (timeout in 1d 23h)"
    assert [w.job_id for w in (await client.list_waiting()).items] == [found.job_id]

    await send(pgwork_dsn, client, shop, "o-1", 5)
    assert await shipments.within(PROMPT)
    assert await client.waiting(chain) is None
    assert (await client.list_waiting()).items == ()


async def test_a_wait_without_a_timeout_has_no_time_and_a_passed_timeout_is_no_wait(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    client, shop, _ = await _shop(make_client, workers, ship=False)
    forever = await start_order(pgwork_dsn, client, shop, Order(id="o-2"))
    brief = await start_order(pgwork_dsn, client, shop, Order(id="o-3", timeout_s=0.3))
    await waiting(pgwork_dsn, 2)

    endless = await client.waiting(forever)
    assert endless is not None
    assert endless.until is None
    assert endless.describe() == "signal 'payment:o-2' (no timeout)"
    # Past its timeout the step is due (pending, no worker runs ``ship`` here): it no
    # longer waits for the signal, as the match would not hand it one.
    await _until(lambda: client.waiting(brief), None)
    listed = (await client.list_waiting(kind="signal")).items
    assert [w.chain_id for w in listed] == [forever]


async def test_list_waiting_filters_by_signal_name_prefix_and_chain_type_and_pages(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    client, shop, _ = await _shop(make_client, workers, ship=False)
    chains = [await start_order(pgwork_dsn, client, shop, Order(id=f"o-{n}")) for n in range(5)]
    await waiting(pgwork_dsn, 5)

    async def names(**filters: Any) -> list[str | None]:
        return [w.signal for w in (await client.list_waiting(**filters)).items]

    assert await names(signal="payment:o-3") == ["payment:o-3"]
    assert await names(signal_prefix="payment:o-") == [f"payment:o-{n}" for n in (4, 3, 2, 1, 0)]
    assert await names(signal_prefix="payment:x") == []
    assert await names(chain_type="order", kind=WaitKind.SIGNAL) == [
        f"payment:o-{n}" for n in (4, 3, 2, 1, 0)
    ]
    assert await names(chain_type="other") == []
    assert await names(kind="sleep") == []

    seen: list[UUID] = []
    cursor = None
    for _ in range(10):
        page = await client.list_waiting(limit=2, cursor=cursor)
        seen += [w.chain_id for w in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == chains[::-1]

    with pytest.raises(ConfigurationError, match="unknown kind of wait"):
        await client.list_waiting(kind="nap")
    with pytest.raises(ConfigurationError, match="signal waits only"):
        await client.list_waiting(kind="sleep", signal="payment:o-1")
    with pytest.raises(ConfigurationError, match="not both"):
        await client.list_waiting(signal="a", signal_prefix="b")
    with pytest.raises(InvalidCursorError):
        await client.list_signals(
            cursor=page.next_cursor or _any_cursor(await client.list_waiting(limit=1))
        )


def _any_cursor(page: Any) -> str:
    assert page.next_cursor is not None
    return str(page.next_cursor)


async def test_list_signals_lists_pending_signals_with_their_age_and_pages(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    client, shop, shipments = await _shop(make_client, workers)
    await send(pgwork_dsn, client, shop, "a-1", 1)
    await send(pgwork_dsn, client, shop, "a-2", 2)
    await send(pgwork_dsn, client, shop, "b-1", 3)
    # One taken by a step: no longer pending.
    await start_order(pgwork_dsn, client, shop, Order(id="b-1"))
    assert await shipments.within(PROMPT)

    pending = (await client.list_signals()).items
    assert [(s.name, s.payload) for s in pending] == [
        ("payment:a-2", {"amount": 2}),
        ("payment:a-1", {"amount": 1}),
    ]
    assert all(s.pending and s.age >= timedelta(0) for s in pending)
    assert [s.name for s in (await client.list_signals(name_prefix="payment:a-2")).items] == [
        "payment:a-2"
    ]
    assert [s.name for s in (await client.list_signals(name="payment:a-1")).items] == [
        "payment:a-1"
    ]
    every = (await client.list_signals(pending=False)).items
    assert [s.name for s in every] == ["payment:b-1", "payment:a-2", "payment:a-1"]
    assert every[0].consumed_by is not None
    assert not every[0].pending

    first = await client.list_signals(limit=1)
    assert first.next_cursor is not None
    second = await client.list_signals(limit=1, cursor=first.next_cursor)
    assert [s.name for s in (*first.items, *second.items)] == ["payment:a-2", "payment:a-1"]
    assert second.next_cursor is None


class Step(BaseModel):
    n: int


async def test_a_sleep_a_debounce_and_blockers_each_say_what_they_wait_for(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    registry = JobTypeRegistry()
    later = registry.job_type("later", input=Step, entry=False)
    first = registry.job_type("first", input=Step, continue_with=[later])
    gate = registry.job_type("gate", input=Step)
    fold = registry.job_type("fold", input=Step)
    client = await make_client(registry)

    async def sleep_two_days(attempt: Any) -> Continue[Step]:
        return Continue(later, attempt.job.input, after=2 * DAY)

    async def noop(attempt: Any) -> None:
        return None

    await workers(client=client, processors={first: sleep_two_days, gate: noop})
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        sleeper = await client.start_chain(conn, first, Step(n=1))
        blocker = await client.start_chain(conn, gate, Step(n=2), schedule=DAY)
        done_blocker = await client.start_chain(conn, gate, Step(n=3))
        blocked = await client.start_chain(conn, gate, Step(n=4), blockers=[blocker, done_blocker])
        debounced = await client.start_chain(
            conn, fold, Step(n=5), dedup=Debounce("k", delay=timedelta(hours=1), max_wait=DAY)
        )
        await conn.commit()
    await client.await_chain(done_blocker.id, timeout=PROMPT)

    slept = await _until(lambda: _kind(client, sleeper.id), WaitKind.SLEEP)
    assert slept.type_name == "later"
    assert slept.chain_index == 1
    assert slept.until is not None
    assert slept.until - slept.as_of > DAY
    assert slept.describe().startswith("a time: ")
    assert slept.describe().endswith("(in 1d 23h)")

    scheduled = await client.waiting(blocker.id)
    assert scheduled is not None
    assert scheduled.kind is WaitKind.SLEEP

    # The blocker's end is counted once settled, a moment after it committed.
    await _until(lambda: _figures(client, blocked.id), (1, 2))
    gated = await client.waiting(blocked.id)
    assert gated is not None
    assert gated.kind is WaitKind.BLOCKERS
    assert (gated.done, gated.total, gated.until) == (1, 2, None)
    assert gated.describe() == "blocker chains (1 of 2 ended)"

    folded = await client.waiting(debounced.id)
    assert folded is not None
    assert folded.kind is WaitKind.DEBOUNCE
    assert folded.deadline is not None
    assert folded.until is not None
    assert folded.describe().startswith("more enqueues of its key (debounced: starts in 59m ")
    assert folded.describe().endswith(", deadline in 23h 59m)")

    kinds = {w.chain_id: w.kind for w in (await client.list_waiting()).items}
    assert kinds == {
        sleeper.id: WaitKind.SLEEP,
        blocker.id: WaitKind.SLEEP,
        blocked.id: WaitKind.BLOCKERS,
        debounced.id: WaitKind.DEBOUNCE,
    }
    assert [w.chain_id for w in (await client.list_waiting(kind="blockers")).items] == [blocked.id]
    assert [w.chain_id for w in (await client.list_waiting(kind="debounce")).items] == [
        debounced.id
    ]


async def test_await_chain_gives_up_saying_what_the_chain_waits_for(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    client, shop, _ = await _shop(make_client, workers)
    chain = await start_order(pgwork_dsn, client, shop, Order(id="o-7", timeout_s=2 * 86400))
    await waiting(pgwork_dsn, 1)

    with pytest.raises(AwaitTimeoutError) as raised:
        await client.await_chain(chain, timeout=0.2)

    assert raised.value.waiting is not None
    assert raised.value.waiting.kind is WaitKind.SIGNAL
    assert f"chain {chain} did not end within 0.2s: it is waiting for signal 'payment:o-7'" in str(
        raised.value
    )
    assert "(timeout in 1d 23h)" in str(raised.value)


async def _kind(client: Any, chain_id: UUID) -> Any:
    return await client.waiting(chain_id)


async def _figures(client: Any, chain_id: UUID) -> tuple[int | None, int | None] | None:
    """(done, total) of what the chain's step waits for; None if it waits for nothing."""
    found = await client.waiting(chain_id)
    return None if found is None else (found.done, found.total)


async def _until(read: Any, wanted: Any, *, timeout: float = PROMPT) -> Any:
    """Read until the result is ``wanted`` (a value, or the kind of a ``Waiting``)."""
    import anyio

    with anyio.fail_after(timeout):
        while True:
            got = await read()
            if got == wanted or getattr(got, "kind", object()) == wanted:
                return got
            await anyio.sleep(0.05)


async def test_blockers_say_how_many_ended_whatever_ended_them(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    """The figures of a blocked step, read from its own counts: a chain started with
    blockers (one completed, one cancelled under "unblock", one not yet due), and a step
    waiting for the first two of four children (one completed, one failed for good, two
    still running)."""
    fan = FanOut()
    gate = fan.registry.job_type("gate", input=Step)
    lenient = fan.registry.job_type("lenient", input=Step, blocker_failure="unblock")
    client = await make_client(fan.registry)
    hold = anyio.Event()

    async def part(attempt: Any) -> Any:
        if attempt.job.input.index >= 2:
            await hold.wait()
        return await fan.do_part(attempt)

    async def noop(attempt: Any) -> None:
        return None

    await workers(client=client, processors={fan.split: fan.do_split, fan.part: part, gate: noop})
    try:
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            done = await client.start_chain(conn, gate, Step(n=1))
            dropped = await client.start_chain(conn, gate, Step(n=2), schedule=DAY)
            later = await client.start_chain(conn, gate, Step(n=3), schedule=DAY)
            await conn.commit()
            await client.await_chain(done.id, timeout=PROMPT)
            await client.cancel(conn, [dropped.id])
            blocked = await client.start_chain(
                conn, lenient, Step(n=4), blockers=[done, dropped, later]
            )
            await conn.commit()
        batch = await start(pgwork_dsn, client, fan, Batch(id="b", size=4, fail_at=1, need=2))

        gated = await client.waiting(blocked.id)
        assert gated is not None
        assert (gated.kind, gated.done, gated.total) == (WaitKind.BLOCKERS, 2, 3)
        assert gated.describe() == "blocker chains (2 of 3 ended)"
        # The children: one completes, one fails, two run on (settled as each ends).
        await _until(lambda: _figures(client, batch), (2, 4))
        collecting = await client.waiting(batch)
        assert collecting is not None
        assert (collecting.type_name, collecting.chain_index) == ("collect", 1)
        assert collecting.describe() == "blocker chains (2 of 4 ended)"
        assert await statuses(pgwork_dsn, "part") == {"completed": 1, "failed": 1, "running": 2}
        listed = {w.chain_id: (w.done, w.total) for w in (await client.list_waiting()).items}
        assert listed[blocked.id] == (2, 3)
        assert listed[batch] == (2, 4)
    finally:
        hold.set()
