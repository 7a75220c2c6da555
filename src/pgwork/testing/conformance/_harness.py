"""The state suite's fixtures and its driver: everything goes through the protocol.

``StateHarness`` builds ``NewJob`` values and wraps the few multi-step moves the tests
repeat (seed and commit, acquire exactly one, read one job back, wait for a lease to
expire). It never reaches under the adapter: a store that passes with this harness
passes for the client and the worker too.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal, TypeVar

import anyio
import pytest

from pgwork._ids import new_id
from pgwork.adapters.notify import Listener, Notice
from pgwork.adapters.state import (
    AcquiredJob,
    Completion,
    CompletionResult,
    CoreStateAdapter,
    Debounce,
    DedupSpec,
    Failure,
    InsertedJob,
    NewJob,
    ReapedJob,
    StateAdapter,
)
from pgwork.records import AttemptError, Chain, Job

__all__ = ["LockWaiters", "RecordingNotify", "StateHarness", "StateSuiteBase", "requires"]

ALPHA = "conformance.alpha"
BETA = "conformance.beta"
CHAIN_TYPE = "conformance.chain"

LockWaiters = Callable[[], Awaitable[int]]
"""Optional probe: how many of the store's sessions are blocked waiting for a lock."""

Case = TypeVar("Case", bound=Callable[..., Any] | type)


def requires(*capabilities: type) -> Callable[[Case], Case]:
    """Mark a conformance case as needing the store to offer ``capabilities`` (capability
    protocols of ``pgwork.adapters.state``: ``BatchedTurns``, ``AtomicAttempts``...).

    On a test, that test; on a suite class, each test it defines. A case is skipped for
    a store that lacks one of them, and runs as any other for a store that has them all
    (PostgreSQL has every one). Which cases need what is checked against the operations
    each case calls (``tests/adapters/test_conformance_capabilities.py``)."""

    def mark(case: Case) -> Case:
        if isinstance(case, type):
            for name, member in vars(case).items():
                if name.startswith("test_") and callable(member):
                    _add_requirements(member, capabilities)
        else:
            _add_requirements(case, capabilities)
        return case

    return mark


def required_capabilities(case: Callable[..., Any]) -> tuple[type, ...]:
    """The capabilities ``requires`` marked ``case`` with (none: the core alone)."""
    found: tuple[type, ...] = getattr(case, "required_capabilities", ())
    return found


def _add_requirements(case: Callable[..., Any], capabilities: Sequence[type]) -> None:
    joined = dict.fromkeys((*required_capabilities(case), *capabilities))
    case.required_capabilities = tuple(joined)  # type: ignore[attr-defined]


class RecordingNotify:
    """A notify adapter that only records what it is asked to publish.

    ``in_transaction_only``: fail a publish outside a transaction (``insert_jobs``
    must announce inside the caller's; ``complete`` on the adapter's own write may
    announce after its commit).
    """

    def __init__(self, *, in_transaction_only: bool = True) -> None:
        self.published: list[Notice] = []
        self.in_transaction_only = in_transaction_only

    async def publish(self, tx: object | None, *, notices: Sequence[Notice]) -> None:
        assert tx is not None or not self.in_transaction_only, "announced outside tx"
        self.published.extend(notices)

    @asynccontextmanager
    async def listen(self) -> AsyncIterator[Listener]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def close(self) -> None:
        pass

    @property
    def ready_queues(self) -> list[str]:
        """Queues announced ready now (not those announced with a due time)."""
        assert all(n.kind == "ready" for n in self.published)
        return sorted(n.queue or "" for n in self.published if n.at is None)


class StateHarness:
    """Drive one ``StateAdapter`` through its protocol, with the suite's defaults."""

    def __init__(self, adapter: StateAdapter, *, lease: timedelta, poll: float) -> None:
        self.adapter = adapter
        self.lease = lease
        self.poll = poll

    # --- building jobs -----------------------------------------------------------------

    def new_job(
        self,
        type_name: str = ALPHA,
        *,
        input: Any = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 3,
        chain_type_name: str = CHAIN_TYPE,
        run_at: datetime | None = None,
        run_after: timedelta | None = None,
        dedup: DedupSpec | Debounce | None = None,
        blockers: Sequence[uuid.UUID] = (),
        blocker_failure: Literal["fail", "cancel", "unblock"] = "fail",
        limit_key: str | None = None,
        limit_group: str | None = None,
    ) -> NewJob:
        """A new chain's first job (``id == chain_id``, ``chain_index == 0``), blocked
        on the chains ``blockers`` when given; ``limit_group`` as a limited type's job
        carries one (``JobType.limit_group``)."""
        job_id = new_id()
        return NewJob(
            id=job_id,
            type_name=type_name,
            chain_id=job_id,
            chain_type_name=chain_type_name,
            chain_index=0,
            input_json=_json({"n": 1} if input is None else input),
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            run_at=run_at,
            run_after=run_after,
            dedup=dedup,
            blockers=tuple(blockers),
            blocker_failure=blocker_failure,
            limit_key=limit_key,
            limit_group=limit_group,
        )

    def continuation(
        self,
        of: AcquiredJob | Job[Any],
        type_name: str = BETA,
        *,
        input: Any = None,
        max_attempts: int = 3,
    ) -> NewJob:
        """The next job of ``of``'s chain (``chain_index + 1``), in the same queue."""
        return NewJob(
            id=new_id(),
            type_name=type_name,
            chain_id=of.chain_id,
            chain_type_name=of.chain_type_name,
            chain_index=of.chain_index + 1,
            input_json=_json({"step": of.chain_index + 1} if input is None else input),
            queue=of.queue,
            priority=of.priority,
            max_attempts=max_attempts,
        )

    @staticmethod
    def again(job: NewJob) -> NewJob:
        """``job`` with a fresh id: the same request, enqueued a second time."""
        job_id = new_id()
        return replace(job, id=job_id, chain_id=job_id)

    # --- steps -------------------------------------------------------------------------

    async def seed(self, *jobs: NewJob) -> list[InsertedJob]:
        """Insert ``jobs`` in one transaction of the adapter's own, and commit."""
        async with self.adapter.transaction() as tx:
            return await self.adapter.insert_jobs(tx, jobs=list(jobs))

    async def acquire(
        self,
        *type_names: str,
        worker: str = "worker-a",
        lease: timedelta | None = None,
        queues: Sequence[str] | None = ("default",),
        limit: int = 10,
    ) -> list[AcquiredJob]:
        names = type_names or (ALPHA, BETA)
        return await self.adapter.acquire(
            worker_id=worker,
            leases={name: lease or self.lease for name in names},
            queues=queues,
            limit=limit,
        )

    async def acquire_one(self, *type_names: str, **kwargs: Any) -> AcquiredJob:
        """Acquire with ``limit=1`` and insist that a job came back."""
        acquired = await self.acquire(*type_names, limit=1, **kwargs)
        assert len(acquired) == 1, f"expected one acquirable job, got {acquired}"
        return acquired[0]

    async def handed_on(self) -> NewJob:
        """A chain whose first job completed and handed on: its second job (chain
        index 1), pending in the store and returned as it was inserted."""
        await self.seed(self.new_job())
        root = await self.acquire_one()
        following = self.continuation(root)
        [result] = await self.adapter.complete(
            None, completions=[Completion(root.id, root.lease_token, '"r"', following)]
        )
        assert result.accepted, f"the hand-on of {root.id} was refused"
        return following

    async def acquire_when_due(
        self, *type_names: str, timeout: float = 10.0, **kwargs: Any
    ) -> AcquiredJob:
        """Poll acquire until a job is handed out (a scheduled job becoming due), and
        check on the store's own clock that it was not handed out early: a lease
        granted at ``t`` ends at ``t + lease``."""
        lease: timedelta = kwargs.get("lease") or self.lease
        deadline = time.monotonic() + timeout
        while True:
            acquired = await self.acquire(*type_names, limit=1, **kwargs)
            if acquired:
                job = acquired[0]
                granted_at = job.leased_until - lease
                assert granted_at >= job.scheduled_at, (
                    f"job {job.id} was handed out at {granted_at}, "
                    f"before it was due at {job.scheduled_at}"
                )
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"no job became acquirable within {timeout}s")
            await anyio.sleep(self.poll)

    async def finish(
        self, job_id: uuid.UUID, output: Any = None, *, continuation: NewJob | None = None
    ) -> CompletionResult:
        """Complete a pending (or running) job from outside any worker, and commit."""
        [result] = await self.adapter.complete(
            None, completions=[Completion(job_id, None, _json(output), continuation)]
        )
        assert result.accepted, f"completing {job_id} by hand was not accepted"
        return result

    async def fail_for_good(self, job: NewJob, *, message: str = "for good") -> None:
        """Run ``job`` (the only ready job of its type in its queue) and fail it with no
        retry left: the job and its chain end ``failed``."""
        held = await self.acquire_one(job.type_name, queues=[job.queue])
        assert held.id == job.id, f"expected to hold {job.id}, got {held.id}"
        error = AttemptError(type="RuntimeError", message=message)
        done = await self.adapter.fail(
            None, failures=[Failure(held.id, held.lease_token, error, None)]
        )
        assert done == [True]

    async def job(self, job_id: uuid.UUID) -> Job[Any]:
        found = await self.adapter.get_jobs(None, job_ids=[job_id])
        assert len(found) == 1, f"expected job {job_id} to exist, got {found}"
        return found[0]

    async def exists(self, job_id: uuid.UUID) -> bool:
        return bool(await self.adapter.get_jobs(None, job_ids=[job_id]))

    async def chain(self, chain_id: uuid.UUID) -> Chain:
        found = await self.adapter.get_chains(None, chain_ids=[chain_id])
        assert len(found) == 1, f"expected chain {chain_id} to exist, got {found}"
        return found[0]

    async def wait_for_store_clock(self, past: datetime, *, timeout: float = 10.0) -> None:
        """Poll the store's clock until it reads later than ``past``: a bounded wait for
        time to pass where the store measures it (retention, silent workers)."""
        deadline = time.monotonic() + timeout
        while await self.adapter.now() <= past:
            if time.monotonic() > deadline:
                raise AssertionError(f"the store's clock did not pass {past} within {timeout}s")
            await anyio.sleep(self.poll)

    async def reap_when_expired(
        self,
        *,
        type_names: Sequence[str] = (ALPHA, BETA),
        exclude_worker: str = "reaper",
        limit: int = 10,
        timeout: float = 10.0,
    ) -> list[ReapedJob]:
        """Poll reap until it takes something back: a bounded wait for a real lease to
        run out on the store's own clock (never on ours)."""
        deadline = time.monotonic() + timeout
        while True:
            reaped = await self.adapter.reap(
                type_names=list(type_names), exclude_worker=exclude_worker, limit=limit
            )
            if reaped:
                return reaped
            if time.monotonic() > deadline:
                raise AssertionError(f"no lease expired within {timeout}s")
            await anyio.sleep(self.poll)


class StateSuiteBase:
    """Fixtures and knobs shared by every part of ``StateAdapterConformance``.

    Subclass ``StateAdapterConformance`` (not this) and define the ``state_adapter``
    fixture: an adapter on a fresh, empty store, closed after the test.
    """

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    # --- timing knobs: real, short leases stand in for time passing --------------------
    lease: ClassVar[timedelta] = timedelta(seconds=30)
    """Lease used where a lease must not run out during the test."""
    short_lease: ClassVar[timedelta] = timedelta(seconds=0.3)
    """Lease the suite lets expire, then waits out on the store's clock (bounded)."""
    expiry_timeout: ClassVar[float] = 10.0
    """Longest wait for a short lease or a short delay to run out."""
    poll: ClassVar[float] = 0.05
    """Pause between two looks at the store while waiting for its clock."""
    blocking_grace: ClassVar[float] = 0.5
    """Without a ``lock_waiters`` probe: how long a blocked writer is watched not to
    finish before the suite lets the writer it waits for commit."""
    test_timeout: ClassVar[float] = 45.0
    """Every concurrent scenario runs under this deadline."""

    @pytest.fixture
    def state_adapter(self) -> StateAdapter:
        """Override: yield a ``StateAdapter`` on a fresh, empty store."""
        pytest.fail(
            f"{type(self).__name__} must define a `state_adapter` fixture yielding a "
            "StateAdapter on a fresh, empty store"
        )

    @pytest.fixture
    def lock_waiters(self) -> LockWaiters | None:
        """Override (optional): a probe counting sessions blocked on a lock in the store.

        With it, the concurrent-enqueue test proves the second writer waits by seeing it
        wait; without it, by watching it not finish for ``blocking_grace`` seconds.
        """
        return None

    @pytest.fixture
    def store(self, state_adapter: StateAdapter) -> StateHarness:
        assert isinstance(state_adapter, CoreStateAdapter), "state_adapter has not the core"
        return StateHarness(state_adapter, lease=self.lease, poll=self.poll)

    @pytest.fixture(autouse=True)
    def _offers_what_the_case_requires(self, request: pytest.FixtureRequest) -> None:
        """Skip a case marked with ``requires`` when the store lacks a capability."""
        needed = required_capabilities(request.function)
        if not needed:
            return
        adapter = request.getfixturevalue("state_adapter")
        missing = [c.__name__ for c in needed if not isinstance(adapter, c)]
        if missing:
            pytest.skip(f"the store does not offer {', '.join(missing)}")


def _json(value: Any) -> str:
    return json.dumps(value)
