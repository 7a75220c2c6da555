"""The operator's work views: jobs of one status in the order of its time, each
worker's running jobs, job types among the oldest ready jobs, failures grouped by
error, ids by range, input fields compared on a bounded window of the newest jobs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from pgwork.adapters.state import OperatorViews, PageKey
from pgwork.adapters.work import InputMatch, WorkFilter, WorkStatus
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, StateSuiteBase, requires

HOUR = timedelta(hours=1)


@requires(OperatorViews)
class WorkConformance(StateSuiteBase):
    async def test_list_work_pages_ready_jobs_across_queues_and_priorities_in_due_order(
        self, store: StateHarness
    ) -> None:
        jobs = [
            store.new_job(queue=queue, priority=priority)
            for queue, priority in [("a", 0), ("b", 0), ("a", 5), ("b", 0), ("a", 0)]
        ]
        for job in jobs:  # one transaction each: due in this order
            await store.seed(job)
        later = store.new_job(queue="a", run_after=HOUR)
        await store.seed(later)

        async def walk(status: WorkStatus, oldest_first: bool, **where: Any) -> list[UUID]:
            seen: list[UUID] = []
            after: PageKey | None = None
            while True:
                page = await store.adapter.list_work(
                    None,
                    where=WorkFilter(status=status, **where),
                    after=after,
                    oldest_first=oldest_first,
                    limit=2,
                )
                seen += [j.id for j in page]
                if len(page) < 2:
                    return seen
                last = page[-1]
                after = PageKey(last.scheduled_at, last.id)

        ready = [j.id for j in jobs]
        assert await walk(WorkStatus.READY, True) == ready
        assert await walk(WorkStatus.READY, False) == ready[::-1]
        assert await walk(WorkStatus.READY, True, queue="b") == [jobs[1].id, jobs[3].id]
        assert await walk(WorkStatus.SCHEDULED, True) == [later.id]

    async def test_list_work_gives_running_jobs_by_worker_and_failed_jobs_by_error(
        self, store: StateHarness
    ) -> None:
        held, idle, broken, other = (
            store.new_job(BETA),
            store.new_job(),
            *[store.new_job() for _ in range(2)],
        )
        await store.seed(broken)
        await store.fail_for_good(broken, message="same")
        await store.seed(other)
        await store.fail_for_good(other, message="different")
        await store.seed(held, idle)
        running = await store.acquire_one(BETA, worker="worker-b")

        async def ids(status: WorkStatus, **where: Any) -> list[UUID]:
            page = await store.adapter.list_work(
                None,
                where=WorkFilter(status=status, **where),
                after=None,
                oldest_first=True,
                limit=10,
            )
            return [j.id for j in page]

        assert running.id == held.id
        assert await ids(WorkStatus.RUNNING) == [held.id]
        assert await ids(WorkStatus.RUNNING, leased_by="worker-b") == [held.id]
        assert await ids(WorkStatus.RUNNING, leased_by="worker-a") == []
        assert await ids(WorkStatus.FAILED) == [broken.id, other.id]
        assert await ids(WorkStatus.FAILED, error_message="same") == [broken.id]
        assert await ids(WorkStatus.FAILED, error_type="RuntimeError", error_message="x") == []

    async def test_running_by_worker_counts_each_workers_jobs_and_gives_its_first(
        self, store: StateHarness
    ) -> None:
        await store.seed(*[store.new_job() for _ in range(4)])
        # One acquire (one transaction) each: started in this order.
        a1, a2, a3 = [await store.acquire_one(worker="worker-a") for _ in range(3)]
        b1 = await store.acquire_one(worker="worker-b")

        async def held(per_worker: int) -> list[tuple[str, int, list[UUID]]]:
            found = await store.adapter.running_by_worker(None, per_worker=per_worker)
            return [(h.worker_id, h.running, [j.id for j in h.oldest]) for h in found]

        assert await held(2) == [("worker-a", 3, [a1.id, a2.id]), ("worker-b", 1, [b1.id])]
        assert await held(5) == [("worker-a", 3, [a1.id, a2.id, a3.id]), ("worker-b", 1, [b1.id])]
        await store.finish(a1.id)
        assert await held(1) == [("worker-a", 2, [a2.id]), ("worker-b", 1, [b1.id])]

    async def test_pending_types_and_error_groups_summarise_what_is_stuck(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(ALPHA, queue="q"), store.new_job(BETA, queue="q"))
        await store.seed(store.new_job(BETA, queue="q"), store.new_job(ALPHA, queue="r"))
        failing = [store.new_job(queue=f"f{i}") for i in range(3)]
        await store.seed(*failing)
        for job, message in zip(failing, ["boom", "boom", "bang"], strict=True):
            await store.fail_for_good(job, message=message)

        types = await store.adapter.pending_types(None, sample=10)
        assert [(t.queue, t.type_name, t.jobs) for t in types] == [
            ("q", ALPHA, 1),
            ("q", BETA, 2),
            ("r", ALPHA, 1),
        ]
        sampled = await store.adapter.pending_types(None, sample=1)
        assert [(t.queue, t.jobs) for t in sampled] == [("q", 1), ("r", 1)]

        groups = await store.adapter.error_groups(None, sample=100, limit=10)
        assert [(g.error_type, g.message, g.jobs, g.queues) for g in groups] == [
            ("RuntimeError", "boom", 2, ("f0", "f1")),
            ("RuntimeError", "bang", 1, ("f2",)),
        ]
        assert len(await store.adapter.error_groups(None, sample=100, limit=1)) == 1

    async def test_jobs_in_id_range_reads_exactly_the_range(self, store: StateHarness) -> None:
        jobs = [store.new_job() for _ in range(3)]
        await store.seed(*jobs)
        ordered = sorted(j.id for j in jobs)

        found = await store.adapter.jobs_in_id_range(
            None, low=ordered[0], high=ordered[1], limit=10
        )
        assert [j.id for j in found] == ordered[:2]
        capped = await store.adapter.jobs_in_id_range(
            None, low=UUID(int=0), high=UUID(int=2**128 - 1), limit=2
        )
        assert [j.id for j in capped] == ordered[:2]

    async def test_scan_input_compares_a_field_as_json_within_one_type(
        self, store: StateHarness
    ) -> None:
        inputs = [
            (ALPHA, {"user_id": 42, "to": {"city": "Oslo"}, "tags": ["a", "b"]}),
            (ALPHA, {"user_id": "42", "to": {"city": "Lima"}}),
            (ALPHA, {"user_id": 42.0}),
            (BETA, {"user_id": 42}),
            (ALPHA, {"other": 42}),
            (ALPHA, [42]),
        ]
        jobs = [store.new_job(name, input=data) for name, data in inputs]
        for job in jobs:  # one after another: ids in this order
            await store.seed(job)
        newest_first = [j.id for j in reversed(jobs)]

        async def found(path: tuple[str, ...], value: str, type_name: str = ALPHA) -> list[UUID]:
            match = InputMatch(type_name=type_name, path=path, value_json=value)
            scan = await store.adapter.scan_input(
                None, match=match, before=None, examine=100, limit=10
            )
            assert scan.examined == len(jobs)
            assert scan.exhausted
            return [j.id for j in scan.jobs]

        assert await found(("user_id",), "42") == [jobs[2].id, jobs[0].id]
        assert await found(("user_id",), '"42"') == [jobs[1].id]
        assert await found(("user_id",), "42", BETA) == [jobs[3].id]
        assert await found(("to", "city"), '"Oslo"') == [jobs[0].id]
        assert await found(("tags", "1"), '"b"') == [jobs[0].id]
        assert await found(("0",), "42") == [jobs[5].id]
        assert await found(("user_id",), "43") == []
        assert newest_first[0] == jobs[5].id

    async def test_scan_input_looks_at_a_bounded_window_and_goes_on_from_its_end(
        self, store: StateHarness
    ) -> None:
        jobs = [store.new_job(input={"n": i % 2}) for i in range(7)]
        for job in jobs:
            await store.seed(job)
        created = {j.id: (await store.job(j.id)).created_at for j in jobs}
        match = InputMatch(type_name=ALPHA, path=("n",), value_json="0")

        first = await store.adapter.scan_input(None, match=match, before=None, examine=3, limit=10)
        # The three newest: jobs 6, 5, 4; of them 6 and 4 hold n = 0.
        assert [j.id for j in first.jobs] == [jobs[6].id, jobs[4].id]
        assert (first.examined, first.exhausted) == (3, False)
        assert first.oldest_examined == PageKey(created[jobs[4].id], jobs[4].id)

        rest = await store.adapter.scan_input(
            None, match=match, before=first.oldest_examined, examine=10, limit=10
        )
        assert [j.id for j in rest.jobs] == [jobs[2].id, jobs[0].id]
        assert (rest.examined, rest.exhausted) == (4, True)
        # A window that ends exactly at the oldest job knows it did.
        exact = await store.adapter.scan_input(
            None, match=match, before=first.oldest_examined, examine=4, limit=10
        )
        assert (exact.examined, exact.exhausted) == (4, True)

        # At its match limit the scan stops at the last match, where the next goes on.
        capped = await store.adapter.scan_input(None, match=match, before=None, examine=10, limit=1)
        assert [j.id for j in capped.jobs] == [jobs[6].id]
        assert (capped.examined, capped.exhausted) == (1, False)
        assert capped.oldest_examined == PageKey(created[jobs[6].id], jobs[6].id)

        empty = await store.adapter.scan_input(
            None, match=match, before=PageKey(created[jobs[0].id], jobs[0].id), examine=10, limit=10
        )
        assert (empty.jobs, empty.examined, empty.oldest_examined) == ((), 0, None)
        assert empty.exhausted
