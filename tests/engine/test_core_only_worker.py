"""A worker and a client on a store that offers only the core of the contract.

The store is the real PostgreSQL adapter seen through its core operations alone
(``tests._core_only.CoreOnly``): no batched turns, due times, atomic attempts, atomic
groups, in-line renewal, blockers, operator views or maintenance. The worker takes
another path for each (an acquire alone, the batcher writing every completion, the
poll for scheduled jobs, no sweep or rollup), and refuses what cannot work without
one when it is built. A turn that failed, or a maintenance step that failed, would be
logged: none may be. Wrapped in ``InstrumentedStateAdapter``, the store offers no more
than it does on its own, and the worker runs on it the same way.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel
from tests._core_only import CORE_OPERATIONS, CoreOnly

from pgwork import (
    Attempt,
    CapabilityMissingError,
    Client,
    Continue,
    JobStatus,
    JobType,
    JobTypeRegistry,
    RetryPolicy,
    create_in_process_worker,
)
from pgwork.adapters.capabilities import CAPABILITY_PROTOCOLS, Capabilities
from pgwork.adapters.state import Lease, RenewResult
from pgwork.observability import (
    ADAPTER_CALL_ERROR,
    ADAPTER_CALL_STOP,
    Event,
    InstrumentedStateAdapter,
)
from pgwork.records import AbortReason
from pgwork.worker._side.lease import renew_forever
from pgwork.worker._side.maintenance import Maintenance

from .conftest import ClientFactory, eventually, scalar

pytestmark = pytest.mark.anyio

# What the worker logs when a turn, a maintenance step or a waiter in line failed.
FAILED = ("turn failed", "maintenance step", "could not wait")


class Num(BaseModel):
    n: int


def assert_no_failed_turns(caplog: pytest.LogCaptureFixture) -> None:
    """The worker logged no failed turn or maintenance step: a capability's operation
    called on a store without it fails softly, that way, and must not have been."""
    failed = [r.getMessage() for r in caplog.records if any(f in r.getMessage() for f in FAILED)]
    assert failed == []


def squaring() -> tuple[JobTypeRegistry, JobType[Num, Num], dict[Any, Any]]:
    """A registry of one staged job type, ``square``, and the processors that run it."""
    reg = JobTypeRegistry()
    square = reg.job_type("square", input=Num, output=Num)

    async def handle(attempt: Attempt[Num, Num]) -> Num:
        return Num(n=attempt.job.input.n**2)

    return reg, square, {square: handle}


async def _status(client: Client, job_id: Any) -> JobStatus:
    return (await client.get_job(job_id)).status


async def test_the_client_sees_a_store_without_any_capability(
    make_client: ClientFactory,
) -> None:
    client = await make_client(JobTypeRegistry(), store=CoreOnly)
    assert client.capabilities == Capabilities(store_type="CoreOnly")
    assert sorted(client.capabilities.missing) == sorted(c.__name__ for c in CAPABILITY_PROTOCOLS)


async def test_a_core_only_worker_runs_staged_jobs_to_completion(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork")
    reg, square, processors = squaring()
    client = await make_client(reg, store=CoreOnly)
    await workers(client=client, processors=processors, max_slots=4)
    started = [await client.start_chain(conn, square, Num(n=i)) for i in range(30)]
    await conn.commit()

    async def all_done() -> bool:
        done = "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed'"
        return await scalar(pgwork_dsn, done) == len(started)

    await eventually(all_done, what="every job completed")
    for i, chain in enumerate(started):
        job = await client.get_job(chain.job_id)
        assert job.output == Num(n=i * i)
    assert_no_failed_turns(caplog)


class Calls:
    """The operations an instrumented store reported: those that returned, those that
    raised."""

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.failed: set[str] = set()

    def on_event(self, event: Event) -> None:
        if event.name == ADAPTER_CALL_STOP:
            self.done.add(event["operation"])
        elif event.name == ADAPTER_CALL_ERROR:
            self.failed.add(event["operation"])


async def test_a_worker_on_an_instrumented_core_only_store_runs_jobs_and_reports_its_calls(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork")
    reg, square, processors = squaring()
    calls = Calls()
    client = await make_client(
        reg, store=lambda state: InstrumentedStateAdapter(CoreOnly(state), observers=[calls])
    )
    assert sorted(client.capabilities.missing) == sorted(c.__name__ for c in CAPABILITY_PROTOCOLS)
    await workers(client=client, processors=processors, max_slots=4)
    started = [await client.start_chain(conn, square, Num(n=i)) for i in range(10)]
    await conn.commit()

    outputs = [await client.await_chain(chain.id, timeout=20) for chain in started]

    assert outputs == [Num(n=i * i) for i in range(10)]
    assert_no_failed_turns(caplog)
    assert calls.failed == set()
    assert {"insert_jobs", "acquire", "complete"} <= calls.done <= set(CORE_OPERATIONS)


async def test_a_chain_hands_on_to_its_continuation_on_a_core_only_store(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork")
    reg = JobTypeRegistry()
    first = reg.job_type("first", input=Num, continue_with=["second"])
    second = reg.job_type("second", input=Num, output=Num, entry=False)
    blocker_outputs: list[list[Any]] = []

    async def hand_on(attempt: Attempt[Num, Any]) -> Any:
        blocker_outputs.append(await attempt.blocker_outputs())
        return Continue(second, Num(n=attempt.job.input.n + 1))

    async def finish(attempt: Attempt[Num, Num]) -> Num:
        return Num(n=attempt.job.input.n * 10)

    client = await make_client(reg, store=CoreOnly)
    await workers(client=client, processors={first: hand_on, second: finish})
    started = await client.start_chain(conn, first, Num(n=4))
    await conn.commit()

    async def chain_done() -> bool:
        return (await client.get_chain(started.id)).status == "completed"

    await eventually(chain_done, what="the chain completed")
    assert (await client.get_chain(started.id)).output == Num(n=50)
    assert [job.type_name for job in await client.list_chain_jobs(started.id)] == [
        "first",
        "second",
    ]
    # No blockers on a store without them: the outputs are empty, not an error.
    assert blocker_outputs == [[]]
    assert_no_failed_turns(caplog)


async def test_a_failing_job_is_retried_up_to_max_attempts_on_a_core_only_store(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork")
    reg = JobTypeRegistry()
    flaky = reg.job_type(
        "flaky", input=Num, max_attempts=3, retry=RetryPolicy(initial=timedelta(0))
    )
    attempts: list[int] = []

    async def handle(attempt: Attempt[Num, Any]) -> None:
        attempts.append(attempt.job.attempt)
        raise ValueError(f"boom on attempt {attempt.job.attempt}")

    client = await make_client(reg, store=CoreOnly)
    await workers(client=client, processors={flaky: handle}, poll_interval=0.2)
    started = await client.start_chain(conn, flaky, Num(n=1))
    await conn.commit()

    async def failed() -> bool:
        return await _status(client, started.job_id) is JobStatus.FAILED

    await eventually(failed, what="the job failed for good")
    job = await client.get_job(started.job_id)
    assert job.attempt == 3
    assert attempts == [1, 2, 3]
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.message == "boom on attempt 3"
    assert_no_failed_turns(caplog)


async def test_a_job_scheduled_a_second_ahead_is_found_by_the_poll(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork")
    reg = JobTypeRegistry()
    planned = reg.job_type("planned", input=Num)
    ran = anyio.Event()
    ran_at: list[float] = []

    async def handle(attempt: Attempt[Num, Any]) -> None:
        ran_at.append(time.monotonic())
        ran.set()

    client = await make_client(reg, store=CoreOnly)
    # Enqueued before the worker listens: no notice announces its due time, and
    # without ``DueTimes`` the worker cannot ask for it; only the poll finds it.
    enqueued = time.monotonic()
    await client.start_chain(conn, planned, Num(n=1), schedule=timedelta(seconds=1))
    await conn.commit()
    await workers(client=client, processors={planned: handle}, poll_interval=0.3)
    with anyio.fail_after(5):
        await ran.wait()
    assert ran_at[0] - enqueued >= 0.9
    assert_no_failed_turns(caplog)


async def test_a_core_only_worker_refuses_an_atomic_job_type_when_built(
    make_client: ClientFactory,
) -> None:
    reg = JobTypeRegistry()
    staged = reg.job_type("staged", input=Num)
    ledger = reg.job_type("ledger", input=Num, mode="atomic")
    client = await make_client(reg, store=CoreOnly)

    async def handle(attempt: Attempt[Num, Any]) -> None:
        return None

    with pytest.raises(CapabilityMissingError) as refused:
        create_in_process_worker(client=client, processors={staged: handle, ledger: handle})
    assert refused.value.capability == "AtomicAttempts"
    assert "'ledger'" in str(refused.value)
    assert "CoreOnly does not offer it" in str(refused.value)
    # A worker of staged types only is built, and asking for atomic groups is refused.
    create_in_process_worker(client=client, processors={staged: handle})
    with pytest.raises(CapabilityMissingError, match="AtomicGroupCommit"):
        create_in_process_worker(client=client, processors={staged: handle}, atomic_group=4)


async def test_the_client_refuses_what_needs_a_capability_before_any_statement(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    client = await make_client(reg, store=CoreOnly)
    gate = await client.start_chain(conn, step, Num(n=1))
    with pytest.raises(CapabilityMissingError, match="ChainBlockers"):
        await client.start_chain(conn, step, Num(n=2), blockers=[gate])
    await conn.commit()  # the caller's transaction was left usable, the first job in it
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 1
    with pytest.raises(CapabilityMissingError, match="OperatorViews"):
        await client.count_jobs()
    with pytest.raises(CapabilityMissingError, match="Maintenance"):
        await client.roll_up_history()


async def test_core_only_maintenance_skips_the_steps_the_store_cannot_run(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork")
    client = await make_client(JobTypeRegistry(), store=CoreOnly)
    maintenance = Maintenance(
        client,
        [],
        tick=0.02,
        sweep_every=0.02,
        retention_every=0.02,
        prune_every=0.02,
        history_every=0.02,
    )
    with anyio.move_on_after(0.3):
        await maintenance.run_forever()
    assert_no_failed_turns(caplog)


class _Holder:
    """One running attempt as the renewer sees it; ``renewals`` counts its renewals."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lease_duration = timedelta(milliseconds=300)
        self.lease_deadline = time.monotonic() + 60.0
        self.settling = False
        self.aborted: list[AbortReason] = []
        self.renewals = 0
        self.renewed_once = anyio.Event()

    def renewed(self, deadline: float) -> None:
        self.renewals += 1
        self.renewed_once.set()

    def abort(self, reason: AbortReason) -> None:
        self.aborted.append(reason)


async def test_a_lease_whose_row_a_caller_holds_is_renewed_on_a_later_tick(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork")
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    client = await make_client(reg, store=CoreOnly)
    await client.start_chain(conn, step, Num(n=1))
    await conn.commit()
    store: Any = client.state
    [job] = await store.acquire(
        worker_id="w", leases={"step": timedelta(seconds=60)}, queues=None, limit=1
    )
    holder = _Holder(job.lease)
    renew = store.renew
    deferred = anyio.Event()
    deferrals = 0

    async def counted(**kwargs: Any) -> list[RenewResult]:
        nonlocal deferrals
        results: list[RenewResult] = await renew(**kwargs)
        deferrals += sum(result.deferred for result in results)
        if deferrals >= 2:
            deferred.set()
        return results

    store.renew = counted
    renewing = functools.partial(
        renew_forever,
        store,
        lambda: [holder],
        shortest_lease=holder.lease_duration,
        in_line=None,
    )
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as caller:
        await caller.execute("SELECT 1 FROM pgwork.jobs WHERE id = %s FOR UPDATE", [job.id])
        async with anyio.create_task_group() as side:
            side.start_soon(renewing)
            with anyio.fail_after(10):
                await deferred.wait()  # two ticks found the row held, and let it be
            assert holder.renewals == 0
            await caller.commit()  # the caller lets go: a later tick renews
            with anyio.fail_after(10):
                await holder.renewed_once.wait()
            side.cancel_scope.cancel()
    assert holder.aborted == []
    assert_no_failed_turns(caplog)
