"""Flow control: acquiring within job types' limits, fairly across limit groups.

Role exercised: ``WorkerStore`` (``acquire_limited``). A limited type's jobs carry the
group the client gave them (``NewJob.limit_group``: the key, or '' for none).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import anyio

from pgwork.adapters.state import (
    AcquiredJob,
    Completion,
    FlowControl,
    LimitedTurn,
    TypeLimits,
)
from pgwork.records import JobStatus
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, StateSuiteBase, requires


def _done(held: AcquiredJob) -> Completion:
    return Completion(held.id, held.lease_token, json.dumps(None))


async def _acquire(
    store: StateHarness,
    limits: dict[str, TypeLimits],
    *,
    limit: int = 10,
    completions: list[Completion] | None = None,
    types: tuple[str, ...] = (ALPHA,),
    worker: str = "worker-a",
    lease: timedelta | None = None,
) -> list[AcquiredJob]:
    turn = await store.adapter.acquire_limited(
        completions=completions or [],
        worker_id=worker,
        leases=dict.fromkeys(types, lease or store.lease),
        queues=["default"],
        limit=limit,
        limits=limits,
    )
    return turn.acquired


@requires(FlowControl)
class FlowConformance(StateSuiteBase):
    async def test_a_type_never_runs_past_its_concurrency(self, store: StateHarness) -> None:
        """Two may run: the first acquire takes two of five, the next none; once one
        of them is completed, one more."""
        await store.seed(*(store.new_job(limit_group="") for _ in range(5)))
        limits = {ALPHA: TypeLimits(concurrency=2)}
        first = await _acquire(store, limits)
        assert len(first) == 2
        assert await _acquire(store, limits) == []
        await store.adapter.complete(None, completions=[_done(first[0])])
        assert len(await _acquire(store, limits)) == 1

    async def test_a_group_never_runs_past_its_key_concurrency(self, store: StateHarness) -> None:
        """One per group: three groups of three jobs (one the group of jobs without a
        key) give three jobs, one each, then none."""
        for group in ("a", "b", ""):
            await store.seed(
                *(store.new_job(limit_key=group or None, limit_group=group) for _ in range(3))
            )
        limits = {ALPHA: TypeLimits(key_concurrency=1)}
        acquired = await _acquire(store, limits)
        assert sorted(j.limit_key or "" for j in acquired) == ["", "a", "b"]
        assert await _acquire(store, limits) == []

    async def test_groups_are_served_in_turn(self, store: StateHarness) -> None:
        """Each group's first job before any group's second, whatever was enqueued
        first (groups in key order); the next acquire goes on from the group after the
        last one served, and wraps around."""
        await store.seed(*(store.new_job(limit_key="a", limit_group="a") for _ in range(6)))
        await store.seed(*(store.new_job(limit_key=k, limit_group=k) for k in ("b", "c")))
        limits = {ALPHA: TypeLimits(key_concurrency=10)}
        first = await _acquire(store, limits, limit=2)
        second = await _acquire(store, limits, limit=2)
        assert sorted(j.limit_key or "" for j in first) == ["a", "b"]
        assert sorted(j.limit_key or "" for j in second) == ["a", "c"]

    async def test_concurrent_acquires_never_lease_past_the_limit(
        self, store: StateHarness
    ) -> None:
        """Eight acquires at once, each asking for ten of a type limited to three:
        three run, however their statements interleave."""
        await store.seed(*(store.new_job(limit_group="") for _ in range(30)))
        limits = {ALPHA: TypeLimits(concurrency=3)}
        taken: list[AcquiredJob] = []

        async def one() -> None:
            taken.extend(await _acquire(store, limits))

        for _ in range(5):
            async with anyio.create_task_group() as group:
                for _ in range(8):
                    group.start_soon(one)
        assert len(taken) == 3
        running = [j for j in taken if (await store.job(j.id)).status is JobStatus.RUNNING]
        assert len(running) == 3

    async def test_the_acquires_own_cap_bounds_what_it_takes(self, store: StateHarness) -> None:
        """``most`` caps one acquire, with or without a shared limit; other types are
        taken beside the limited ones, as acquire would."""
        await store.seed(*(store.new_job() for _ in range(4)))
        await store.seed(*(store.new_job(BETA, limit_group="") for _ in range(4)))
        limits = {ALPHA: TypeLimits(most=1), BETA: TypeLimits(concurrency=10, most=2)}
        acquired = await _acquire(store, limits, types=(ALPHA, BETA))
        assert Counter(j.type_name for j in acquired) == {ALPHA: 1, BETA: 2}

    async def test_types_without_limits_are_acquired_beside_limited_ones(
        self, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(3)))
        await store.seed(*(store.new_job(BETA, limit_group="") for _ in range(3)))
        limits = {BETA: TypeLimits(concurrency=1)}
        acquired = await _acquire(store, limits, types=(ALPHA, BETA))
        assert Counter(j.type_name for j in acquired) == {ALPHA: 3, BETA: 1}

    async def test_a_lost_workers_place_counts_until_its_job_is_taken_back_and_no_longer(
        self, store: StateHarness
    ) -> None:
        """One may run. A worker that stops renewing (killed) holds the place while its
        lease runs, so another worker's acquire gets nothing; once the expired lease is
        reaped the place is free again. A worker known dead gives its place back at
        once, lease or not."""
        await store.seed(*(store.new_job(limit_group="") for _ in range(3)))
        limits = {ALPHA: TypeLimits(concurrency=1)}
        [lost] = await _acquire(store, limits, worker="worker-a", lease=self.short_lease)
        assert await _acquire(store, limits, worker="worker-b") == []
        # Expired, on the store's clock, but not yet taken back: it still counts.
        with anyio.fail_after(self.expiry_timeout):
            while True:
                if await store.adapter.now() > lost.leased_until:
                    break
                await anyio.sleep(store.poll)
        assert await _acquire(store, limits, worker="worker-b") == []
        reaped = await store.reap_when_expired(type_names=[ALPHA], timeout=self.expiry_timeout)
        assert [r.job_id for r in reaped] == [lost.id]
        assert len(await _acquire(store, limits, worker="worker-b")) == 1
        assert await _acquire(store, limits, worker="worker-c") == []
        await store.adapter.reap(
            type_names=[ALPHA], exclude_worker="reaper", limit=10, dead_workers=["worker-b"]
        )
        assert len(await _acquire(store, limits, worker="worker-c")) == 1

    async def test_a_limited_turn_completes_the_batch_it_carries(self, store: StateHarness) -> None:
        """The completions are written with the acquire, and the room they free is
        taken by the same acquire: one place, its job completed, the next one leased
        in the same turn, and none beyond."""
        await store.seed(*(store.new_job(limit_group="") for _ in range(3)))
        limits = {ALPHA: TypeLimits(concurrency=1)}
        [held] = await _acquire(store, limits)
        turn = await _turn(store, limits, completions=[_done(held)])
        assert [(r.job_id, r.accepted) for r in turn.results] == [(held.id, True)]
        assert (await store.job(held.id)).status is JobStatus.COMPLETED
        assert len(turn.acquired) == 1
        assert await _acquire(store, limits) == []

    async def test_a_turn_takes_the_place_its_completion_frees_in_a_key(
        self, store: StateHarness
    ) -> None:
        """One per key: the turn that completes key "a"'s job leases "a"'s next job."""
        await store.seed(*(store.new_job(limit_key="a", limit_group="a") for _ in range(2)))
        limits = {ALPHA: TypeLimits(key_concurrency=1)}
        [held] = await _acquire(store, limits)
        turn = await _turn(store, limits, completions=[_done(held)])
        assert [j.limit_key for j in turn.acquired] == ["a"]

    async def test_room_a_short_acquire_waited_for_is_reported_once_it_frees(
        self, store: StateHarness
    ) -> None:
        """Two places, four jobs. The first acquire takes two and comes back short with
        two left: a worker waits. An acquire that finds no room reports nothing. The
        turn that completes both and asks for one job takes one place and leaves the
        other, which it reports, once."""
        await store.seed(*(store.new_job(limit_group="") for _ in range(4)))
        limits = {ALPHA: TypeLimits(concurrency=2)}
        first = await _turn(store, limits)
        assert len(first.acquired) == 2
        assert first.waited_for == frozenset()
        assert (await _turn(store, limits)).waited_for == frozenset()  # no room
        freed = await _turn(store, limits, completions=[_done(j) for j in first.acquired], limit=1)
        assert len(freed.acquired) == 1
        assert freed.waited_for == frozenset({ALPHA})
        taken = await _turn(store, limits)
        assert len(taken.acquired) == 1
        assert taken.waited_for == frozenset()

    async def test_a_short_acquire_not_expected_short_still_leaves_its_mark(
        self, store: StateHarness
    ) -> None:
        """``expect_short=False`` is a hint only: the acquire that comes back short
        anyway still marks the type, and the turn that frees room reports it."""
        await store.seed(*(store.new_job(limit_group="") for _ in range(4)))
        limits = {ALPHA: TypeLimits(concurrency=2)}
        first = await _turn(store, limits, expect_short=False)
        assert len(first.acquired) == 2
        freed = await _turn(
            store,
            limits,
            completions=[_done(j) for j in first.acquired],
            limit=1,
            expect_short=False,
        )
        assert freed.waited_for == frozenset({ALPHA})

    async def test_an_acquire_that_takes_all_it_may_leaves_no_one_waiting(
        self, store: StateHarness
    ) -> None:
        """A limit that does not bind: the acquire takes every job, nobody waits, and
        the turns that complete them report nothing."""
        await store.seed(*(store.new_job(limit_group="") for _ in range(3)))
        limits = {ALPHA: TypeLimits(concurrency=10)}
        taken = await _turn(store, limits)
        assert len(taken.acquired) == 3
        done = await _turn(store, limits, completions=[_done(j) for j in taken.acquired])
        assert taken.waited_for == done.waited_for == frozenset()


async def _turn(
    store: StateHarness,
    limits: dict[str, TypeLimits],
    *,
    completions: list[Completion] | None = None,
    limit: int = 10,
    expect_short: bool = True,
) -> LimitedTurn:
    return await store.adapter.acquire_limited(
        completions=completions or [],
        worker_id="worker-a",
        leases={ALPHA: store.lease},
        queues=["default"],
        limit=limit,
        limits=limits,
        expect_short=expect_short,
    )
