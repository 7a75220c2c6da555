"""A Hypothesis state machine over the real PostgreSQL state adapter.

Rules enqueue, acquire, renew, complete, fail, release, reschedule, begin an atomic
attempt and reap, with live leases, stale ones (superseded by a later acquire) and
forged ones. A plain model predicts every answer; the invariants compare the database
with the model after each step:

* at most one live holder per job (a running job has exactly the model's token);
* completed is final;
* attempts only grow, except the documented hand-backs (release, and reschedule
  without counting the attempt);
* a stale or forged token changes nothing (the row is byte-for-byte the same);
* every enqueued job is accounted for.

Lease expiry is simulated by moving ``leased_until`` into the past, so no step sleeps.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar
from uuid import UUID

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from pgwork import PostgresStateAdapter
from pgwork.adapters.state import Completion, Failure, Lease, NewJob
from pgwork.records import AttemptError

pytestmark = pytest.mark.timeout(180)

TYPE = "sm"
WORKER = "sm-worker"
LEASES = {TYPE: timedelta(seconds=60)}
ERROR = AttemptError(type="Boom", message="boom")
# Everything a fenced write could touch: a refused write must leave all of it alone.
ROW = """
SELECT id, status::text, attempt, lease_token, leased_by, leased_until, output,
       last_attempt_error, scheduled_at, completed_at
FROM pgwork.jobs WHERE id = %s
"""


@dataclass(slots=True)
class Expected:
    status: str
    attempt: int
    token: UUID | None
    max_attempts: int
    expired: bool = False


class AdapterMachine(RuleBasedStateMachine):
    """Set ``runner`` and ``state`` on the class before running it."""

    runner: ClassVar[asyncio.Runner]
    state: ClassVar[PostgresStateAdapter]

    jobs = Bundle("jobs")
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[UUID, Expected] = {}
        self.seen_attempts: dict[UUID, int] = {}
        self.handed_back: set[UUID] = set()
        self.completed: set[UUID] = set()
        self._sql("TRUNCATE pgwork.jobs CASCADE")

    # --- plumbing ----------------------------------------------------------------------

    def _run(self, coro: Any) -> Any:
        return self.runner.run(coro)

    def _sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        async def go() -> list[tuple[Any, ...]]:
            async with self.state.pool.connection() as conn:
                cur = await conn.execute(query, params or None)
                return [tuple(r) for r in await cur.fetchall()] if cur.description else []

        result: list[tuple[Any, ...]] = self._run(go())
        return result

    def _row(self, job_id: UUID) -> tuple[Any, ...]:
        (row,) = self._sql(ROW, job_id)
        return row

    def _live(self, lease: Lease) -> bool:
        expected = self.model[lease.job_id]
        return expected.status == "running" and expected.token == lease.lease_token

    def _fenced(self, lease: Lease, write: Any) -> tuple[bool, Any]:
        """Run ``write``; when the lease is not live, prove the row did not change."""
        live = self._live(lease)
        before = self._row(lease.job_id)
        result = self._run(write)
        if not live:
            assert self._row(lease.job_id) == before, "a stale token changed the job"
        return live, result

    def _settle(self, job_id: UUID, status: str, *, attempt_delta: int = 0) -> None:
        expected = self.model[job_id]
        expected.status, expected.token, expected.expired = status, None, False
        expected.attempt = max(expected.attempt + attempt_delta, 0)
        if attempt_delta < 0:
            self.handed_back.add(job_id)

    # --- rules -------------------------------------------------------------------------

    @rule(target=jobs, max_attempts=st.integers(1, 3))
    def enqueue(self, max_attempts: int) -> UUID:
        job_id = uuid.uuid4()
        job = NewJob(
            id=job_id,
            type_name=TYPE,
            chain_id=job_id,
            chain_type_name=TYPE,
            chain_index=0,
            input_json="{}",
            queue="default",
            priority=0,
            max_attempts=max_attempts,
        )

        async def go() -> None:
            async with self.state.transaction() as tx:
                await self.state.insert_jobs(tx, jobs=[job])

        self._run(go())
        self.model[job_id] = Expected("pending", 0, None, max_attempts)
        return job_id

    @rule(target=leases, limit=st.integers(1, 3))
    def acquire(self, limit: int) -> Any:
        got = self._run(
            self.state.acquire(worker_id=WORKER, leases=LEASES, queues=None, limit=limit)
        )
        ready = [j for j, e in self.model.items() if e.status == "pending"]
        assert len(got) == min(limit, len(ready))
        for acquired in got:
            expected = self.model[acquired.id]
            assert expected.status == "pending", "acquired a job that was not pending"
            expected.status, expected.token, expected.expired = (
                "running",
                acquired.lease_token,
                False,
            )
            expected.attempt += 1
            assert acquired.attempt == expected.attempt
        return multiple(*(a.lease for a in got))

    @rule(target=leases, job_id=jobs)
    def forge(self, job_id: UUID) -> Lease:
        """A token that was never issued."""
        return Lease(job_id, uuid.uuid4())

    @rule(lease=leases)
    def renew(self, lease: Lease) -> None:
        live, results = self._fenced(
            lease, self.state.renew(leases=[lease], duration={lease.job_id: LEASES[TYPE]})
        )
        (result,) = results
        assert result.renewed == live
        assert (result.job_id, result.lease_token) == (lease.job_id, lease.lease_token)
        if live:
            self.model[lease.job_id].expired = False

    @rule(lease=leases)
    def complete(self, lease: Lease) -> None:
        completion = Completion(lease.job_id, lease.lease_token, '"done"')
        live, results = self._fenced(lease, self.state.complete(None, completions=[completion]))
        assert results[0].accepted == live
        if live:
            self._settle(lease.job_id, "completed")

    @rule(lease=leases, terminal=st.booleans())
    def fail(self, lease: Lease, terminal: bool) -> None:
        retry = None if terminal else timedelta(0)
        failure = Failure(lease.job_id, lease.lease_token, ERROR, retry)
        live, accepted = self._fenced(lease, self.state.fail(None, failures=[failure]))
        assert accepted == [live]
        if live:
            self._settle(lease.job_id, "failed" if terminal else "pending")

    @rule(lease=leases)
    def release(self, lease: Lease) -> None:
        live, released = self._fenced(lease, self.state.release(leases=[lease]))
        assert released == (1 if live else 0)
        if live:
            self._settle(lease.job_id, "pending", attempt_delta=-1)

    @rule(lease=leases, count_attempt=st.booleans())
    def reschedule(self, lease: Lease, count_attempt: bool) -> None:
        live, ok = self._fenced(
            lease,
            self.state.reschedule(
                None, lease=lease, run_at=None, run_after=timedelta(0), count_attempt=count_attempt
            ),
        )
        assert ok == live
        if live:
            self._settle(lease.job_id, "pending", attempt_delta=0 if count_attempt else -1)

    @rule(lease=leases)
    def begin_atomic(self, lease: Lease) -> None:
        async def go() -> bool:
            async with self.state.transaction() as tx:
                locked = await self.state.begin_atomic(
                    tx, lease=lease, deadline=timedelta(seconds=5)
                )
                return locked

        live, locked = self._fenced(lease, go())
        # An atomic attempt begins only on a lease the database still counts as held:
        # one whose lease ran out is refused even while its token holds the job.
        assert locked == (live and not self.model[lease.job_id].expired)

    @rule(job_id=jobs)
    def expire(self, job_id: UUID) -> None:
        """Let the job's lease run out (moves the deadline instead of sleeping)."""
        expected = self.model[job_id]
        if expected.status == "running":
            self._sql(
                "UPDATE pgwork.jobs SET leased_until = now() - interval '1 second' WHERE id = %s",
                job_id,
            )
            expected.expired = True

    @rule(limit=st.integers(1, 3), by_holder=st.booleans())
    def reap(self, limit: int, by_holder: bool) -> None:
        reaper = WORKER if by_holder else "sm-reaper"
        got = self._run(self.state.reap(type_names=[TYPE], exclude_worker=reaper, limit=limit))
        expired = {j for j, e in self.model.items() if e.status == "running" and e.expired}
        if by_holder:
            assert got == [], "a worker reaped its own lease"
            return
        assert len(got) == min(limit, len(expired))
        for reaped in got:
            assert reaped.job_id in expired
            expected = self.model[reaped.job_id]
            assert reaped.attempt == expected.attempt
            terminal = expected.attempt >= expected.max_attempts
            assert reaped.status.value == ("failed" if terminal else "pending")
            self._settle(reaped.job_id, reaped.status.value)

    # --- invariants --------------------------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        rows = self._sql("SELECT id, status::text, attempt, lease_token FROM pgwork.jobs")
        assert {r[0] for r in rows} == set(self.model), "an enqueued job is unaccounted for"
        for job_id, status, attempt, token in rows:
            expected = self.model[job_id]
            assert (status, attempt) == (expected.status, expected.attempt), job_id
            # At most one live holder: a running job carries exactly one token.
            assert (token is not None) == (status == "running")
            assert token == expected.token

    @invariant()
    def completed_is_final_and_attempts_only_grow(self) -> None:
        rows = self._sql("SELECT id, status::text, attempt FROM pgwork.jobs")
        for job_id, status, attempt in rows:
            if job_id in self.completed:
                assert status == "completed"
            if status == "completed":
                self.completed.add(job_id)
            previous = self.seen_attempts.get(job_id, 0)
            if job_id not in self.handed_back:
                assert attempt >= previous
            self.seen_attempts[job_id] = attempt
        self.handed_back.clear()


@pytest.fixture
def adapter_machine(pgwork_dsn: str) -> Iterator[type[AdapterMachine]]:
    with asyncio.Runner() as runner:
        state = runner.run(PostgresStateAdapter.connect(pgwork_dsn, min_size=1, max_size=2))
        AdapterMachine.runner = runner
        AdapterMachine.state = state
        try:
            yield AdapterMachine
        finally:
            runner.run(state.close())


def test_state_adapter_keeps_its_invariants(adapter_machine: type[AdapterMachine]) -> None:
    run_state_machine_as_test(
        adapter_machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
