"""``stop()`` returns within ``grace_period + abandon_after`` and a moment for the last
writes (``LATE_SETTLE_S``), whatever the database does (docs/workers.md).

Each case leaves one of the worker's own statements unanswered once the worker is
busy: the database is reachable for everything else, and the statement would only end
once ``operation_timeout`` gave up on it, long after the bound. (A network path that
drops packets does exactly this: tests/faults/test_network_blackhole.py.) What the
worker cannot settle in time it leaves behind, as a killed worker would: the lease
lapses and a reaper takes the job back.

Control: a stop that waits for an acquire in flight until it comes back, or lets the
batcher's shielded write run to its end, waits out the hung statement, and
``fail_after`` ends the first two cases. The others hold the same line for the
renewal, the heartbeat, a failure's write and the stop's own hand-back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    JobTypeRegistry,
    PostgresStateAdapter,
    create_in_process_worker,
)
from pgwork.errors import DatabaseTimeoutError
from pgwork.worker._loop import LATE_SETTLE_S

from .conftest import ClientFactory

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

GRACE_S = 0.2
ABANDON_S = 0.3
# Far beyond the bound: a stop that waits for the statement fails the test.
UNANSWERED_S = 30.0
# The bound, and room for a loaded machine (this is no measurement: the control takes
# UNANSWERED_S).
WITHIN_S = GRACE_S + ABANDON_S + LATE_SETTLE_S + 3.0


class Num(BaseModel):
    n: int


def _unanswered_once_armed(
    name: str, armed: anyio.Event, reached: anyio.Event
) -> Callable[..., Awaitable[Any]]:
    """``PostgresStateAdapter.<name>``, but once ``armed`` is set the database does not
    answer it: the call gives up only after UNANSWERED_S, as ``operation_timeout``
    would."""
    real = getattr(PostgresStateAdapter, name)

    async def unanswered(self: PostgresStateAdapter, *args: Any, **kwargs: Any) -> Any:
        if not armed.is_set():
            return await real(self, *args, **kwargs)
        reached.set()
        await anyio.sleep(UNANSWERED_S)
        raise DatabaseTimeoutError(name, UNANSWERED_S)

    return unanswered


@pytest.mark.parametrize(
    "statements",
    [
        # An acquire in flight.
        ("complete_and_acquire",),
        # A completion's write: the batcher's own, or an acquire's that took it along.
        ("complete", "complete_and_acquire"),
        ("renew",),  # the lease renewal
        ("heartbeat",),  # the worker's heartbeat
        ("fail",),  # the write of a failed attempt
        ("release",),  # the stop handing an aborted job back
    ],
    ids=lambda statements: "-or-".join(statements),
)
async def test_stop_returns_within_its_bound_while_a_statement_goes_unanswered(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
    statements: tuple[str, ...],
) -> None:
    armed = anyio.Event()
    reached = anyio.Event()
    for statement in statements:
        monkeypatch.setattr(
            PostgresStateAdapter, statement, _unanswered_once_armed(statement, armed, reached)
        )
    reg = JobTypeRegistry()
    work = reg.job_type("work", input=Num, lease=timedelta(seconds=1))
    client = await make_client(reg)
    running = anyio.Event()
    finish = anyio.Event()

    async def handle(attempt: Attempt[Num, Any]) -> None:
        # One completes, one fails, one runs until the stop aborts it (its lease is
        # renewed meanwhile).
        n = attempt.job.input.n
        if n == 2:
            running.set()
            await anyio.sleep_forever()
        await finish.wait()
        if n == 1:
            raise RuntimeError("this one fails")

    worker = create_in_process_worker(
        client=client,
        processors={work: handle},
        max_slots=4,
        poll_interval=0.05,
        heartbeat_interval=0.1,
        grace_period=GRACE_S,
        abandon_after=ABANDON_S,
    )
    await worker.start()
    try:
        await client.start_chains(conn, [ChainStart(work, Num(n=n)) for n in (0, 1, 2)])
        await conn.commit()
        with anyio.fail_after(10):
            await running.wait()
        armed.set()
        finish.set()
        if statements != ("release",):  # a hand-back happens only as the worker stops
            with anyio.fail_after(10):
                await reached.wait()
    finally:
        with anyio.fail_after(WITHIN_S):
            await worker.stop()
    assert reached.is_set()
