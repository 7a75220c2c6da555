"""A handler starts only on a lease the database still counts as held.

The database dates an acquired job's lease from the acquire's transaction. When the
answer comes back late (a server that hung mid-statement, a stalled network path), part
of the lease is already gone; counted from the answer, the worker could start a handler
on a lease that has lapsed, which another worker's reaper may take at any moment: the
job would run twice. The worker counts the lease from when it sent the acquire instead,
and a job whose lease ran out before its handler could start is given back untouched.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import Attempt, JobTypeRegistry, PostgresStateAdapter
from pgwork.worker import _loop as worker_loop
from pgwork.worker._runner import SlotRunner
from pgwork.worker._slots import Slots

from .conftest import ClientFactory, eventually

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=1)


class Num(BaseModel):
    n: int


# An atomic attempt has a second guard: its transaction begins only on a lease the
# database still counts as held (the conformance suite tests it), so the control that
# counts from the answer is shown for a staged one.
@pytest.mark.parametrize(
    ("build", "mode"),
    [
        ("counts-from-send", "staged"),
        ("counts-from-send", "atomic"),
        ("control-counts-from-answer", "staged"),
    ],
)
async def test_a_late_acquire_answer_never_starts_a_handler_on_a_lapsed_lease(
    make_client: ClientFactory,
    workers: Any,
    pgwork_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    build: str,
    mode: str,
) -> None:
    late: list[object] = []

    def delayed(name: str) -> Any:
        original = getattr(PostgresStateAdapter, name)

        async def answer_late(self: PostgresStateAdapter, **kwargs: Any) -> Any:
            result = await original(self, **kwargs)
            jobs = result[1] if isinstance(result, tuple) else result
            if jobs and not late:
                late.append(jobs[0].id)
                await anyio.sleep(1.5 * LEASE.total_seconds())  # the answer arrives late
            return result

        return answer_late

    for name in ("acquire", "complete_and_acquire"):
        monkeypatch.setattr(PostgresStateAdapter, name, delayed(name))
    if build != "counts-from-send":
        arrived = Slots.arrived

        def from_answer(self: Slots, acquired: Any, *, leased_at: float | None = None) -> None:
            arrived(self, acquired)

        monkeypatch.setattr(Slots, "arrived", from_answer)

    reg = JobTypeRegistry()
    job_type = reg.job_type("leased", input=Num, lease=LEASE, mode=mode)
    lease_held_at_start: list[bool] = []

    async def handler(attempt: Attempt[Num, Any]) -> None:
        async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
            cur = await c.execute(
                "SELECT leased_until > clock_timestamp() FROM pgwork.jobs WHERE id = %s",
                (attempt.job.id,),
            )
            row = await cur.fetchone()
        lease_held_at_start.append(bool(row and row[0]))

    client = await make_client(reg)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        chain = await client.start_chain(conn, job_type, Num(n=1))
        await conn.commit()
    await workers(client=client, processors={job_type: handler}, poll_interval=0.2)

    async def finished() -> bool:
        job = await client.get_job(chain.id)
        return job is not None and job.status.value in ("completed", "failed")

    await eventually(finished, timeout=20, what="the job to finish")
    assert late, "no acquire answered late: the test exercised nothing"
    if build == "counts-from-send":
        assert lease_held_at_start == [True]
        # The lapsed lease was handed back, not reaped: no attempt burned.
        assert (await client.get_job(chain.id)).attempt == 1
    else:
        assert False in lease_held_at_start


@pytest.mark.parametrize("mode", ["staged", "atomic"])
@pytest.mark.parametrize("build", ["renews-first", "control-starts-as-is"])
async def test_a_handler_starts_with_most_of_its_lease_ahead(
    make_client: ClientFactory,
    workers: Any,
    pgwork_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    build: str,
    mode: str,
) -> None:
    """An answer that came back late, but not past its lease, leaves a lease with little
    time to run: the renewer's next tick might come after it lapsed. The worker renews
    it before the handler starts."""
    late: list[object] = []
    original = PostgresStateAdapter.acquire

    async def answer_late(self: PostgresStateAdapter, **kwargs: Any) -> Any:
        jobs = await original(self, **kwargs)
        if jobs and not late:
            late.append(jobs[0].id)
            await anyio.sleep(0.6 * LEASE.total_seconds())
        return jobs

    monkeypatch.setattr(PostgresStateAdapter, "acquire", answer_late)
    # No periodic renewal: on a loaded machine its tick (a third of the lease) could
    # fall between the late answer and the handler's start, and renew the lease that
    # the control build leaves as it came.
    monkeypatch.setattr(worker_loop, "renew_forever", _never_renew)
    if build != "renews-first":
        monkeypatch.setattr(SlotRunner, "run", SlotRunner._start)

    reg = JobTypeRegistry()
    job_type = reg.job_type("leased", input=Num, lease=LEASE, mode=mode)
    ahead_at_start: list[float] = []

    async def handler(attempt: Attempt[Num, Any]) -> None:
        async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
            cur = await c.execute(
                "SELECT extract(epoch FROM leased_until - clock_timestamp())::float8"
                " FROM pgwork.jobs WHERE id = %s",
                (attempt.job.id,),
            )
            row = await cur.fetchone()
        assert row is not None
        ahead_at_start.append(row[0])

    client = await make_client(reg)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        chain = await client.start_chain(conn, job_type, Num(n=1))
        await conn.commit()
    await workers(client=client, processors={job_type: handler}, poll_interval=0.2)

    async def finished() -> bool:
        job = await client.get_job(chain.id)
        return job.status.value in ("completed", "failed")

    await eventually(finished, timeout=20, what="the job to finish")
    assert late, "no acquire answered late: the test exercised nothing"
    assert len(ahead_at_start) == 1
    # A fresh lease has (nearly) all of its second ahead; the one taken by the acquire
    # had at most 0.4 s left when its answer arrived.
    assert (ahead_at_start[0] > 0.5) is (build == "renews-first"), ahead_at_start


async def _never_renew(*args: Any, **kwargs: Any) -> None:
    await anyio.sleep_forever()
