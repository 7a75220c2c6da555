"""The worker registry: registration, heartbeats, dead workers and their jobs.

A worker is dead once its heartbeat is older than a limit on the store's clock; the
suite lets ``short_silence`` seconds pass there for real (bounded polls of
``list_workers``) instead of forging old heartbeats.

Role exercised: ``WorkerRegistry``, with ``ReadStore.list_workers``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import ClassVar

import anyio

from pgwork.adapters.state import Completion, Maintenance, WorkerInfo
from pgwork.records import ChainStatus, JobStatus
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, StateSuiteBase, requires

# A window every heartbeat of a test falls within.
ALIVE_WITHIN_S = 3600.0


def worker_info(worker_id: str) -> WorkerInfo:
    return WorkerInfo(
        id=worker_id,
        host="conformance-host",
        pid=4242,
        queues=("default", "mail"),
        job_types=(ALPHA, BETA),
        max_slots=7,
        metadata={"version": "1.2.3", "tags": ["a", "b"]},
    )


class RegistryConformance(StateSuiteBase):
    short_silence: ClassVar[float] = 0.3
    """Seconds without a heartbeat after which the suite declares a worker dead."""

    async def test_registered_worker_is_listed_alive_with_what_it_registered(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        before = await adapter.now()
        await adapter.register_worker(worker=worker_info("w-1"))
        [record] = await adapter.list_workers(alive_within_s=ALIVE_WITHIN_S)
        assert (record.id, record.host, record.pid) == ("w-1", "conformance-host", 4242)
        assert record.queues == ("default", "mail")
        assert record.job_types == (ALPHA, BETA)
        assert (record.max_slots, record.active_slots, record.status) == (7, 0, "idle")
        assert dict(record.metadata) == {"version": "1.2.3", "tags": ["a", "b"]}
        assert record.alive
        assert before <= record.started_at <= record.heartbeat_at

        assert await adapter.heartbeat(worker_id="w-1", active_slots=3, status="busy")
        [beaten] = await adapter.list_workers(alive_within_s=ALIVE_WITHIN_S)
        assert (beaten.active_slots, beaten.status) == (3, "busy")
        assert beaten.heartbeat_at >= record.heartbeat_at
        assert beaten.started_at == record.started_at
        assert not await adapter.heartbeat(
            worker_id="never-registered", active_slots=0, status="idle"
        )

        # A restart registers the same id again: one row, fresh and idle.
        await adapter.register_worker(worker=replace(worker_info("w-1"), pid=99, max_slots=2))
        await adapter.register_worker(worker=replace(worker_info("w-2"), queues=("other",)))
        listed = {w.id: w for w in await adapter.list_workers(alive_within_s=ALIVE_WITHIN_S)}
        assert set(listed) == {"w-1", "w-2"}
        assert (listed["w-1"].pid, listed["w-1"].max_slots) == (99, 2)
        assert (listed["w-1"].active_slots, listed["w-1"].status) == (0, "idle")
        assert listed["w-1"].started_at >= record.started_at
        assert listed["w-2"].queues == ("other",)

    async def test_find_dead_workers_marks_only_silent_ones_stopped_and_only_once(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        for worker_id in ("silent", "me", "lively", "left"):
            await adapter.register_worker(worker=worker_info(worker_id))
        # A worker that said goodbye is not dead, however long it stays silent.
        assert await adapter.heartbeat(worker_id="left", active_slots=0, status="stopped")
        await self._until_silent(store, "silent", "me", "lively")
        assert await adapter.heartbeat(worker_id="lively", active_slots=1, status="busy")

        dead = await adapter.find_dead_workers(older_than_s=self.short_silence, exclude="me")
        assert dead == ["silent"]
        assert await adapter.find_dead_workers(older_than_s=self.short_silence, exclude="me") == []
        listed = {w.id: w for w in await adapter.list_workers(alive_within_s=ALIVE_WITHIN_S)}
        assert (listed["silent"].status, listed["silent"].alive) == ("stopped", False)
        assert (listed["me"].status, listed["me"].alive) == ("idle", True)
        assert (listed["lively"].status, listed["lively"].alive) == ("busy", True)
        assert not listed["left"].alive

        # The dead worker's next heartbeat tells it so; registering brings it back.
        assert not await adapter.heartbeat(worker_id="silent", active_slots=0, status="idle")
        [still] = [
            w for w in await adapter.list_workers(alive_within_s=ALIVE_WITHIN_S) if w.id == "silent"
        ]
        assert still.status == "stopped"
        await adapter.register_worker(worker=worker_info("silent"))
        assert await adapter.heartbeat(worker_id="silent", active_slots=0, status="idle")
        [back] = [
            w for w in await adapter.list_workers(alive_within_s=ALIVE_WITHIN_S) if w.id == "silent"
        ]
        assert back.alive

    @requires(Maintenance)
    async def test_prune_deletes_only_workers_stopped_longer_than_the_retention(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        await adapter.register_worker(worker=worker_info("left"))
        assert await adapter.heartbeat(worker_id="left", active_slots=0, status="stopped")
        for worker_id in ("silent", "dead"):
            await adapter.register_worker(worker=worker_info(worker_id))
        # Every heartbeat so far is older than short_silence once "dead"'s is.
        await self._until_silent(store, "dead")
        dead = await adapter.find_dead_workers(older_than_s=self.short_silence, exclude="silent")
        assert dead == ["dead"]
        for worker_id in ("lively", "left-late"):
            await adapter.register_worker(worker=worker_info(worker_id))
        assert await adapter.heartbeat(worker_id="lively", active_slots=1, status="busy")
        assert await adapter.heartbeat(worker_id="left-late", active_slots=0, status="stopped")

        # "left" stopped and "dead" was declared dead long enough ago; "silent" has an
        # old heartbeat but was never stopped; "left-late" stopped just now.
        assert await adapter.prune_workers(stopped_for_s=self.short_silence) == 2
        assert await self._ids(store) == {"silent", "lively", "left-late"}
        assert await adapter.prune_workers(stopped_for_s=self.short_silence) == 0
        assert await adapter.prune_workers(stopped_for_s=0.0, limit=0) == 0

    async def _ids(self, store: StateHarness) -> set[str]:
        return {w.id for w in await store.adapter.list_workers(alive_within_s=ALIVE_WITHIN_S)}

    async def test_reap_takes_back_every_running_job_of_dead_workers_at_once(
        self, store: StateHarness
    ) -> None:
        jobs = [store.new_job(), store.new_job(), store.new_job(BETA)]
        last_try = store.new_job(max_attempts=1)
        await store.seed(*jobs, last_try)
        lost = await store.acquire(worker="ghost", lease=self.lease, limit=10)
        assert len(lost) == 4
        live = store.new_job()
        await store.seed(live)
        kept = await store.acquire_one(worker="alive")

        # None of the ghost's leases has expired, one type is not asked for, and the
        # limit is one: a dead worker's jobs come back all the same, all of them.
        reaped = await store.adapter.reap(
            type_names=[ALPHA], exclude_worker="alive", limit=1, dead_workers=["ghost"]
        )
        assert {r.job_id for r in reaped} == {j.id for j in lost}
        assert {r.leased_by for r in reaped} == {"ghost"}
        assert {r.job_id: r.status for r in reaped} == {
            **{j.id: JobStatus.PENDING for j in jobs},
            last_try.id: JobStatus.FAILED,
        }
        assert all(r.attempt == 1 for r in reaped)
        for job in jobs:
            row = await store.job(job.id)
            assert row.status is JobStatus.PENDING
            assert (row.leased_by, row.leased_until) == (None, None)
            assert row.last_attempt_error is not None
        assert (await store.chain(last_try.id)).status is ChainStatus.FAILED
        alive = await store.job(kept.id)
        assert (alive.status, alive.leased_by) == (JobStatus.RUNNING, "alive")

        stale = lost[0]
        [late] = await store.adapter.complete(
            None, completions=[Completion(stale.id, stale.lease_token, '"late"')]
        )
        assert not late.accepted
        again = await store.adapter.reap(
            type_names=[], exclude_worker="alive", limit=10, dead_workers=["ghost"]
        )
        assert again == []
        assert len(await store.acquire(worker="alive", limit=10)) == 3

    async def _until_silent(self, store: StateHarness, *worker_ids: str) -> None:
        """Poll until the store no longer counts these workers alive within
        ``short_silence`` seconds: their heartbeats are that old on its clock."""
        deadline = time.monotonic() + self.expiry_timeout
        while True:
            workers = await store.adapter.list_workers(alive_within_s=self.short_silence)
            if not any(w.alive for w in workers if w.id in worker_ids):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"workers {worker_ids} still alive after {self.expiry_timeout}s"
                )
            await anyio.sleep(self.poll)
