"""The read side: job, chain and blocked-job listings (filters and keyset pages) and
per-queue counts.

Job listings are newest first by id (ids are UUIDv7, made just before the insert);
chain and blocked-job listings by ``(created_at, id)``. A ``PageKey`` built from the
last row of a page asks for the rows strictly after it. Jobs seeded in one transaction
share their ``created_at``, so the ties are broken by id — the suite seeds ties on
purpose.

Role exercised: ``ReadStore``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeVar
from uuid import UUID

from pgwork.adapters.state import (
    LISTED_BLOCKERS,
    BlockerEdge,
    BlockerStatus,
    ChainBlockers,
    ChainFilter,
    Completion,
    JobFilter,
    NewJob,
    OperatorViews,
    PageKey,
)
from pgwork.records import ChainStatus, JobStatus
from pgwork.testing.conformance._harness import (
    ALPHA,
    BETA,
    CHAIN_TYPE,
    StateHarness,
    StateSuiteBase,
    requires,
)
from pgwork.testing.conformance._rollback import rolled_back

OTHER_CHAIN = "conformance.other"
# No job has it.
NO_SUCH_JOB = UUID(int=7)
CLOCK_SLACK = timedelta(seconds=5)


class _Listed(Protocol):
    @property
    def id(self) -> UUID: ...

    @property
    def created_at(self) -> Any: ...


L = TypeVar("L", bound=_Listed)


async def all_pages(
    page: Callable[[PageKey | None, int], Awaitable[Sequence[L]]], *, size: int
) -> list[L]:
    """Walk a listing ``size`` rows at a time, each page after the previous one's last."""
    rows: list[L] = []
    after: PageKey | None = None
    for _ in range(100):
        got = await page(after, size)
        assert len(got) <= size
        rows.extend(got)
        if len(got) < size:
            return rows
        after = PageKey(got[-1].created_at, got[-1].id)
    raise AssertionError("the listing did not end within 100 pages")


def newest_first(rows: Sequence[L]) -> list[UUID]:
    return [r.id for r in sorted(rows, key=lambda r: (r.created_at, r.id), reverse=True)]


def newest_id_first(rows: Sequence[L]) -> list[UUID]:
    return sorted((r.id for r in rows), reverse=True)


class QueryConformance(StateSuiteBase):
    async def test_list_jobs_pages_walk_every_job_newest_first_once_across_ties(
        self, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(5)))
        await store.seed(*(store.new_job() for _ in range(4)))

        async def page(after: PageKey | None, limit: int) -> Sequence[Any]:
            return await store.adapter.list_jobs(None, where=JobFilter(), after=after, limit=limit)

        everything = await page(None, 100)
        assert len(everything) == 9
        assert [j.id for j in everything] == newest_id_first(everything)
        for size in (1, 3, 9):
            walked = await all_pages(page, size=size)
            assert [j.id for j in walked] == [j.id for j in everything]
        last = everything[-1]
        assert await page(PageKey(last.created_at, last.id), 10) == []

    async def test_list_jobs_filters_by_type_queue_status_chain_and_creation_time(
        self, store: StateHarness
    ) -> None:
        early = store.new_job(queue="mail")
        await store.seed(early)
        report, beta = store.new_job(queue="reports"), store.new_job(BETA, queue="mail")
        await store.seed(report, beta)
        late = store.new_job(queue="mail")
        await store.seed(late)
        held = await store.acquire_one(queues=["mail"])
        assert held.id == early.id
        follow = store.continuation(held)
        await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "1", follow)]
        )
        first = await store.job(early.id)
        last = await store.job(late.id)

        async def ids(**where: Any) -> set[UUID]:
            found = await store.adapter.list_jobs(
                None, where=JobFilter(**where), after=None, limit=100
            )
            return {j.id for j in found}

        assert await ids(type_name=BETA) == {beta.id, follow.id}
        assert await ids(queue="reports") == {report.id}
        assert await ids(status=JobStatus.COMPLETED) == {early.id}
        assert await ids(chain_id=early.id) == {early.id, follow.id}
        assert await ids(type_name=ALPHA, queue="mail", status=JobStatus.PENDING) == {late.id}
        assert await ids(created_after=first.created_at) == {
            report.id,
            beta.id,
            late.id,
            follow.id,
        }
        assert await ids(created_before=last.created_at) == {early.id, report.id, beta.id}
        between = await ids(created_after=first.created_at, created_before=last.created_at)
        assert between == {report.id, beta.id}
        assert await ids(queue="nowhere") == set()

        uncommitted = store.new_job(queue="reports")
        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.insert_jobs(tx, jobs=[uncommitted])
            seen = await store.adapter.list_jobs(
                tx, where=JobFilter(queue="reports"), after=None, limit=10
            )
            assert [j.id for j in seen] == [uncommitted.id, report.id]
        assert await ids(queue="reports") == {report.id}

    async def test_list_jobs_go_by_id_the_order_jobs_were_enqueued_in(
        self, store: StateHarness
    ) -> None:
        """``created_at`` is the enqueuing transaction's start; the id is made when the
        job is enqueued. A job enqueued late in a long transaction lists before one
        enqueued earlier from elsewhere, and the creation-time filters still go by
        ``created_at``."""
        async with store.adapter.transaction() as tx:
            await store.adapter.list_jobs(tx, where=JobFilter(), after=None, limit=1)
            elsewhere = store.new_job(queue="order")
            await store.seed(elsewhere)
            late = store.new_job(queue="order")
            await store.adapter.insert_jobs(tx, jobs=[late])
        first, second = await store.job(elsewhere.id), await store.job(late.id)
        assert second.created_at < first.created_at
        assert late.id > elsewhere.id

        listed = await store.adapter.list_jobs(
            None, where=JobFilter(queue="order"), after=None, limit=10
        )
        assert [j.id for j in listed] == [late.id, elsewhere.id]
        after_late = await store.adapter.list_jobs(
            None,
            where=JobFilter(queue="order", created_after=second.created_at),
            after=None,
            limit=10,
        )
        assert [j.id for j in after_late] == [elsewhere.id]

    async def test_list_chains_filters_by_type_and_status_and_pages_newest_first(
        self, store: StateHarness
    ) -> None:
        done, failed, going = (store.new_job(queue=q) for q in ("done", "failed", "going"))
        await store.seed(done, failed, going)
        cancelled = store.new_job(queue="cancelled")
        other = store.new_job(queue="other", chain_type_name=OTHER_CHAIN)
        await store.seed(cancelled, other)
        await store.finish(done.id, "ok")
        await store.fail_for_good(failed)
        follow = store.continuation(await store.job(going.id))
        await store.finish(going.id, "step", continuation=follow)
        async with store.adapter.transaction() as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[cancelled.id])

        async def page(after: PageKey | None, limit: int, **where: Any) -> Sequence[Any]:
            return await store.adapter.list_chains(
                None, where=ChainFilter(**where), after=after, limit=limit
            )

        everything = await page(None, 100)
        assert len(everything) == 5
        assert [c.id for c in everything] == newest_first(everything)
        walked = await all_pages(page, size=2)
        assert [c.id for c in walked] == [c.id for c in everything]

        async def ids(**where: Any) -> set[UUID]:
            return {c.id for c in await page(None, 100, **where)}

        assert await ids(type_name=OTHER_CHAIN) == {other.id}
        assert await ids(type_name=CHAIN_TYPE) == {done.id, failed.id, going.id, cancelled.id}
        assert await ids(status=ChainStatus.ACTIVE) == {going.id, other.id}
        assert await ids(status=ChainStatus.FAILED) == {failed.id}
        assert await ids(status=ChainStatus.CANCELLED, type_name=OTHER_CHAIN) == set()
        first_batch = (await store.chain(done.id)).created_at
        assert await ids(created_after=first_batch) == {cancelled.id, other.id}
        assert await ids(created_before=first_batch) == set()

        [continuing] = await page(None, 10, status=ChainStatus.ACTIVE, type_name=CHAIN_TYPE)
        assert continuing.id == going.id
        assert continuing.type_name == CHAIN_TYPE
        assert continuing.current_job.id == follow.id
        assert continuing.input == (await store.job(going.id)).input
        [finished] = await page(None, 10, status=ChainStatus.COMPLETED)
        assert finished.output == "ok"
        assert finished.completed_at is not None

    async def test_list_chains_shows_a_chain_while_its_first_job_runs(
        self, store: StateHarness
    ) -> None:
        """A running root is listed like any other: by its type, its status, and among
        the types present (the only chain of its type here is the running one)."""
        waiting = store.new_job(queue="run")
        await store.seed(waiting)
        running = store.new_job(queue="run", chain_type_name=OTHER_CHAIN)
        await store.seed(running)
        held = await store.acquire_one(queues=["run"])
        assert held.id == waiting.id
        held = await store.acquire_one(queues=["run"])
        assert held.id == running.id
        newer = store.new_job(queue="later")
        await store.seed(newer)

        async def ids(after: PageKey | None = None, **where: Any) -> list[UUID]:
            found = await store.adapter.list_chains(
                None, where=ChainFilter(**where), after=after, limit=100
            )
            return [c.id for c in found]

        everything = [newer.id, running.id, waiting.id]
        assert await ids() == everything
        assert await ids(status=ChainStatus.ACTIVE) == everything
        assert await ids(type_name=OTHER_CHAIN) == [running.id]
        assert await ids(type_name=OTHER_CHAIN, status=ChainStatus.ACTIVE) == [running.id]
        assert await ids(type_name=OTHER_CHAIN, status=ChainStatus.COMPLETED) == []
        listed = await store.chain(newer.id)
        assert await ids(PageKey(listed.created_at, listed.id)) == [running.id, waiting.id]
        [chain] = await store.adapter.list_chains(
            None, where=ChainFilter(type_name=OTHER_CHAIN), after=None, limit=1
        )
        assert chain.current_job.status is JobStatus.RUNNING

        await store.finish(running.id, "done")
        assert await ids(type_name=OTHER_CHAIN, status=ChainStatus.COMPLETED) == [running.id]
        assert await ids(type_name=OTHER_CHAIN, status=ChainStatus.ACTIVE) == []

    @requires(ChainBlockers, OperatorViews)
    async def test_list_blocked_jobs_gives_each_blockers_status_in_declaration_order(
        self, store: StateHarness
    ) -> None:
        active, ended = store.new_job(queue="a"), store.new_job(queue="e")
        await store.seed(active, ended)
        await store.finish(ended.id)
        both = store.new_job(BETA, queue="merge", blockers=[ended.id, active.id])
        one = store.new_job(BETA, queue="merge", blockers=[active.id])
        free = store.new_job(BETA, queue="merge", blockers=[ended.id])
        await store.seed(both, one, free)
        later = store.new_job(BETA, queue="merge", blockers=[active.id, ended.id])
        await store.seed(later)

        async def page(after: PageKey | None, limit: int) -> Sequence[Any]:
            blocked = await store.adapter.list_blocked_jobs(None, after=after, limit=limit)
            return [b.job for b in blocked]

        listed = await store.adapter.list_blocked_jobs(None, after=None, limit=10)
        assert [b.job.id for b in listed] == newest_first([b.job for b in listed])
        assert {b.job.id for b in listed} == {both.id, one.id, later.id}
        assert all(b.job.status is JobStatus.BLOCKED for b in listed)
        blockers = {b.job.id: b.blockers for b in listed}
        assert blockers[both.id] == (
            BlockerStatus(ended.id, ChainStatus.COMPLETED),
            BlockerStatus(active.id, ChainStatus.ACTIVE),
        )
        assert blockers[one.id] == (BlockerStatus(active.id, ChainStatus.ACTIVE),)
        assert blockers[later.id] == (
            BlockerStatus(active.id, ChainStatus.ACTIVE),
            BlockerStatus(ended.id, ChainStatus.COMPLETED),
        )
        walked = await all_pages(page, size=1)
        assert [j.id for j in walked] == [b.job.id for b in listed]
        counts = {
            b.job.id: (b.blockers_needed, b.blockers_met, b.blockers_open, b.more_blockers)
            for b in listed
        }
        assert counts == {
            both.id: (2, 1, 1, False),
            one.id: (1, 0, 1, False),
            later.id: (2, 1, 1, False),
        }

        await store.finish(active.id)
        assert await store.adapter.list_blocked_jobs(None, after=None, limit=10) == []

    @requires(ChainBlockers, OperatorViews)
    async def test_a_job_waiting_for_many_chains_lists_its_first_and_pages_them_all(
        self, store: StateHarness
    ) -> None:
        """A blocked job is listed with its first ``LISTED_BLOCKERS`` blockers in
        declaration order (not their ids' order) and its counts; ``list_blockers`` pages
        through every one by position."""
        many = LISTED_BLOCKERS + 5
        chains = [store.new_job(queue="a") for _ in range(many)]
        await store.seed(*chains)
        ended = {chains[0].id, chains[3].id, chains[-1].id}
        for chain_id in ended:
            await store.finish(chain_id)
        declared = [c.id for c in reversed(chains)]
        waiting = store.new_job(BETA, queue="merge", blockers=declared)
        exactly = store.new_job(BETA, queue="merge", blockers=declared[:LISTED_BLOCKERS])
        await store.seed(waiting, exactly)

        def status(chain_id: UUID) -> ChainStatus:
            return ChainStatus.COMPLETED if chain_id in ended else ChainStatus.ACTIVE

        listed = {
            b.job.id: b for b in await store.adapter.list_blocked_jobs(None, after=None, limit=10)
        }
        first = [BlockerStatus(c, status(c)) for c in declared[:LISTED_BLOCKERS]]
        assert listed[waiting.id].blockers == tuple(first)
        assert listed[waiting.id].more_blockers
        assert (
            listed[waiting.id].blockers_needed,
            listed[waiting.id].blockers_met,
            listed[waiting.id].blockers_open,
        ) == (many, len(ended), many - len(ended))
        assert listed[exactly.id].blockers == tuple(first)
        assert not listed[exactly.id].more_blockers

        edges: list[BlockerEdge] = []
        after: int | None = None
        for _ in range(many):
            page = await store.adapter.list_blockers(None, job_id=waiting.id, after=after, limit=7)
            assert len(page) <= 7
            edges.extend(page)
            if len(page) < 7:
                break
            after = page[-1].position
        assert edges == [BlockerEdge(n, c, status(c)) for n, c in enumerate(declared)]
        assert (
            await store.adapter.list_blockers(None, job_id=NO_SUCH_JOB, after=None, limit=7) == []
        )

    @requires(ChainBlockers, OperatorViews)
    async def test_count_jobs_gives_each_queues_unfinished_work_and_pause_state(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(queue="a"))
        await store.acquire_one(queues=["a"])
        scheduled = store.new_job(queue="a", run_after=timedelta(hours=1))
        finished = store.new_job(queue="a")
        elsewhere = store.new_job(queue="c")
        failing = store.new_job(queue="b", max_attempts=1)
        await store.seed(scheduled, finished, elsewhere, failing)
        await store.finish(finished.id)
        await store.finish(elsewhere.id)
        await store.fail_for_good(failing)
        ready: list[NewJob] = [store.new_job(queue="a") for _ in range(2)]
        await store.seed(*ready)
        await store.seed(store.new_job(BETA, queue="b", blockers=[scheduled.id]))
        await store.adapter.set_queue_paused(None, queue="idle", paused=True)

        counts = {c.queue: c for c in await store.adapter.count_jobs(None)}
        assert [c.queue for c in await store.adapter.count_jobs(None)] == ["a", "b", "idle"]
        a, b, idle = counts["a"], counts["b"], counts["idle"]
        assert (a.paused, a.ready, a.scheduled, a.running, a.blocked, a.failed) == (
            False,
            2,
            1,
            1,
            0,
            0,
        )
        assert a.depth == 3
        oldest = min([(await store.job(j.id)).scheduled_at for j in ready])
        assert a.oldest_ready_at == oldest
        assert a.oldest_ready_age is not None
        assert timedelta(0) <= a.oldest_ready_age < CLOCK_SLACK
        assert (b.ready, b.scheduled, b.running, b.blocked, b.failed) == (0, 0, 0, 1, 1)
        assert b.oldest_ready_at is None
        assert b.oldest_ready_age is None
        assert idle.paused
        assert (idle.ready, idle.scheduled, idle.running, idle.blocked, idle.failed) == (
            0,
            0,
            0,
            0,
            0,
        )

        await store.adapter.set_queue_paused(None, queue="a", paused=True)
        assert {c.queue: c.paused for c in await store.adapter.count_jobs(None)} == {
            "a": True,
            "b": False,
            "idle": True,
        }
