"""Signals: steps that wait for a named signal, and matching the two.

A waiting step is a continuation with ``NewJob.wait_signal``: inserted ``blocked``
without a timeout, ``pending`` at its timeout with one (``run_after``). A signal is
written by ``send_signals`` in a caller's transaction. ``match_signals`` pairs a
name's pending signals with its waiting steps, oldest with oldest, each once;
``sweep_signals`` finds the names a lost match left; ``received_signal`` is what a
step's attempts read; ``prune_signals`` deletes what nothing will read.

Role exercised: ``ChainSignals`` (with ``EnqueueStore`` and ``WorkerCore`` for the
steps).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import anyio

from pgwork._ids import new_id
from pgwork.adapters.state import (
    ChainBlockers,
    ChainSignals,
    Completion,
    NewJob,
    NewSignal,
    SignalDelivery,
)
from pgwork.records import JobStatus
from pgwork.testing.conformance._harness import (
    ALPHA,
    BETA,
    RecordingNotify,
    StateHarness,
    StateSuiteBase,
    requires,
)
from pgwork.testing.conformance._rollback import rolled_back

NAME = "payment:order-1"


def _signal(name: str = NAME, payload: Any = None) -> NewSignal:
    return NewSignal(id=new_id(), name=name, payload_json=json.dumps(payload or {"n": 1}))


async def _waiting(
    store: StateHarness,
    name: str = NAME,
    *,
    timeout: timedelta | None = None,
    queue: str = "default",
) -> NewJob:
    """A chain whose first job handed on to a step waiting for ``name`` (with
    ``timeout`` as its schedule): the step, as it was inserted."""
    await store.seed(store.new_job(queue=queue))
    root = await store.acquire_one(queues=[queue])
    step = replace(store.continuation(root), wait_signal=name, run_after=timeout)
    [result] = await store.adapter.complete(
        None, completions=[Completion(root.id, root.lease_token, '"r"', step)]
    )
    assert result.accepted, f"the hand-on of {root.id} was refused"
    return step


async def _send(store: StateHarness, *signals: NewSignal) -> None:
    adapter = store.adapter
    assert isinstance(adapter, ChainSignals)
    async with adapter.transaction() as tx:
        await adapter.send_signals(tx, signals=list(signals))


@requires(ChainSignals)
class SignalConformance(StateSuiteBase):
    @requires(ChainBlockers)
    async def test_a_step_waiting_without_a_timeout_is_blocked_and_no_sweep_settles_it(
        self, store: StateHarness
    ) -> None:
        step = await _waiting(store)
        job = await store.job(step.id)
        assert (job.status, job.attempt) == (JobStatus.BLOCKED, 0)
        assert await store.acquire(BETA, queues=None) == []
        # Blocked on no chain: the blockers' sweep must leave it be.
        await store.adapter.sweep_blocked(limit=100)
        assert (await store.job(step.id)).status is JobStatus.BLOCKED

    async def test_a_step_waiting_with_a_timeout_is_pending_until_it(
        self, store: StateHarness
    ) -> None:
        step = await _waiting(store, timeout=timedelta(hours=1))
        job = await store.job(step.id)
        assert job.status is JobStatus.PENDING
        assert job.scheduled_at - job.created_at >= timedelta(minutes=59)
        assert await store.acquire(BETA, queues=None) == []

    async def test_a_signal_in_a_rolled_back_transaction_was_never_sent(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        step = await _waiting(store)
        async with rolled_back(adapter.transaction()) as tx:
            await adapter.send_signals(tx, signals=[_signal()])
        match = await adapter.match_signals(names=[NAME])
        assert match.delivered == ()
        assert (await store.job(step.id)).status is JobStatus.BLOCKED

    async def test_a_match_hands_the_signal_to_its_step_which_becomes_ready(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        step = await _waiting(store, queue="orders")
        sent = _signal(payload={"amount": 12})
        await _send(store, sent)
        assert await adapter.received_signal(None, job_id=step.id) is None

        match = await adapter.match_signals(names=[NAME])
        [delivery] = match.delivered
        assert (delivery.signal_id, delivery.job_id, delivery.name) == (sent.id, step.id, NAME)
        assert match.ready_queues == ("orders",)
        held = await store.acquire_one(BETA, queues=["orders"])
        assert (held.id, held.attempt) == (step.id, 1)
        received = await adapter.received_signal(None, job_id=step.id)
        assert received is not None
        assert (received.signal_id, received.name, received.payload) == (
            sent.id,
            NAME,
            {"amount": 12},
        )
        # Matched once: a second match finds nothing to do.
        assert (await adapter.match_signals(names=[NAME])).delivered == ()

    async def test_a_signal_sent_before_any_step_waits_is_kept_for_the_first(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        early = _signal()
        await _send(store, early)
        assert (await adapter.match_signals(names=[NAME])).delivered == ()
        step = await _waiting(store)
        [delivery] = (await adapter.match_signals(names=[NAME])).delivered
        assert (delivery.signal_id, delivery.job_id) == (early.id, step.id)

    async def test_signals_to_one_name_queue_oldest_to_oldest_each_once(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        first, second = await _waiting(store), await _waiting(store)
        signals = [_signal(payload={"n": n}) for n in range(3)]
        await _send(store, *signals)
        match = await adapter.match_signals(names=[NAME, NAME])
        assert [(d.signal_id, d.job_id) for d in match.delivered] == [
            (signals[0].id, first.id),
            (signals[1].id, second.id),
        ]
        # The third waits for the next step.
        third = await _waiting(store)
        [late] = (await adapter.match_signals(names=[NAME])).delivered
        assert (late.signal_id, late.job_id) == (signals[2].id, third.id)

    async def test_a_name_nothing_waits_for_leaves_other_names_alone(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        step = await _waiting(store, "payment:order-2")
        await _send(store, _signal("payment:order-1"), _signal("payment:order-3"))
        match = await adapter.match_signals(names=["payment:order-1", "payment:order-2"])
        assert match.delivered == ()
        assert (await store.job(step.id)).status is JobStatus.BLOCKED

    async def test_a_step_whose_timeout_passed_is_no_longer_waiting(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        step = await _waiting(store, timeout=timedelta(milliseconds=200))
        held = await store.acquire_when_due(BETA, queues=None, timeout=self.expiry_timeout)
        assert held.id == step.id
        await _send(store, _signal())
        assert (await adapter.match_signals(names=[NAME])).delivered == ()
        assert await adapter.received_signal(None, job_id=step.id) is None
        # The signal is kept for the next step that waits.
        later = await _waiting(store)
        [delivery] = (await adapter.match_signals(names=[NAME])).delivered
        assert delivery.job_id == later.id

    async def test_a_step_that_timed_out_and_put_itself_back_takes_no_signal(
        self, store: StateHarness
    ) -> None:
        """A step that started without its signal and put its job back for later (an
        attempt that does not count, so ``attempt`` is back at 0) has started: a
        signal sent since is kept for the next step, and every attempt of this one
        reads none."""
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        step = await _waiting(store, timeout=timedelta(milliseconds=200))
        held = await store.acquire_when_due(BETA, queues=None, timeout=self.expiry_timeout)
        assert held.id == step.id
        assert await adapter.reschedule(
            None, lease=held.lease, run_at=None, run_after=timedelta(hours=1), count_attempt=False
        )
        job = await store.job(step.id)
        assert (job.status, job.attempt) == (JobStatus.PENDING, 0)
        await _send(store, _signal())
        assert (await adapter.match_signals(names=[NAME])).delivered == ()
        assert (await adapter.sweep_signals(limit=10)).delivered == ()
        assert await adapter.received_signal(None, job_id=step.id) is None
        later = await _waiting(store)
        [delivery] = (await adapter.match_signals(names=[NAME])).delivered
        assert delivery.job_id == later.id

    async def test_concurrent_matches_of_one_name_deliver_each_signal_once(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        steps = [await _waiting(store) for _ in range(4)]
        await _send(store, *[_signal(payload={"n": n}) for n in range(4)])
        deliveries: list[SignalDelivery] = []
        busy: set[str] = set()

        async def match(names: list[str]) -> None:
            found = await adapter.match_signals(names=names)
            # A match that found the name busy (another match of it under way) left it
            # alone; whether one does depends on timing, not on the contract.
            assert not set(found.busy) & {d.name for d in found.delivered}, found
            deliveries.extend(found.delivered)
            busy.update(found.busy)

        with anyio.fail_after(self.test_timeout):
            async with anyio.create_task_group() as group:
                for _ in range(4):
                    group.start_soon(match, [NAME])
            # Asked again, as a worker does, once the others ended: nothing is left.
            for _ in range(4):
                if not busy:
                    break
                names = sorted(busy)
                busy.clear()
                await match(names)
        assert not busy
        assert sorted(d.job_id for d in deliveries) == sorted(s.id for s in steps)
        assert len({d.signal_id for d in deliveries}) == 4

    async def test_the_sweep_pairs_what_no_match_was_asked_for(self, store: StateHarness) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        step = await _waiting(store, "payment:swept")
        alone = await _waiting(store, "payment:alone")
        await _send(store, _signal("payment:swept"), _signal("payment:unheard"))
        swept = await adapter.sweep_signals(limit=10)
        assert [(d.job_id, d.name) for d in swept.delivered] == [(step.id, "payment:swept")]
        assert (await store.job(alone.id)).status is JobStatus.BLOCKED
        assert (await adapter.sweep_signals(limit=10)).delivered == ()

    async def test_sending_announces_each_name_in_the_transaction(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        notify = RecordingNotify()
        async with adapter.transaction() as tx:
            await adapter.send_signals(
                tx, signals=[_signal("a:1"), _signal("a:1"), _signal("b")], notify=notify
            )
        announced = sorted((n.kind, n.name) for n in notify.published)
        assert announced == [("signal", "a:1"), ("signal", "b")]

    async def test_pruning_keeps_what_a_step_may_still_read(self, store: StateHarness) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        running = await _waiting(store, "p:running")
        done = await _waiting(store, "p:done")
        await _send(store, _signal("p:running"), _signal("p:done"), _signal("p:nobody"))
        assert len((await adapter.match_signals(names=["p:running", "p:done"])).delivered) == 2
        held = await store.acquire(BETA, queues=None)
        assert {j.id for j in held} == {running.id, done.id}
        finished = next(j for j in held if j.id == done.id)
        [result] = await adapter.complete(
            None, completions=[Completion(finished.id, finished.lease_token, "1")]
        )
        assert result.accepted
        # Nothing is older than a day yet.
        assert await adapter.prune_signals(older_than=timedelta(days=1)) == 0
        # Sent before this call's transaction began: the unread one and the completed
        # step's go; the running step's stays.
        assert await adapter.prune_signals(older_than=timedelta(0)) == 2
        assert await adapter.received_signal(None, job_id=running.id) is not None
        assert await adapter.received_signal(None, job_id=done.id) is None

    async def test_a_waiting_step_of_a_cancelled_chain_is_cancelled_and_takes_no_signal(
        self, store: StateHarness
    ) -> None:
        adapter = store.adapter
        assert isinstance(adapter, ChainSignals)
        step = await _waiting(store)
        async with adapter.transaction() as tx:
            await adapter.cancel_chains(tx, chain_ids=[step.chain_id])
        assert (await store.job(step.id)).status is JobStatus.CANCELLED
        await _send(store, _signal())
        assert (await adapter.match_signals(names=[NAME])).delivered == ()

    async def test_a_waiting_step_in_a_batch_is_written_beside_plain_jobs(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(queue="a"))
        root = await store.acquire_one(queues=["a"])
        step = replace(store.continuation(root), wait_signal=NAME)
        plain = store.new_job(ALPHA, queue="b")
        async with store.adapter.transaction() as tx:
            inserted = await store.adapter.insert_jobs(tx, jobs=[plain, step])
        assert [i.status for i in inserted] == [JobStatus.PENDING, JobStatus.BLOCKED]
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        assert (await store.acquire_one(ALPHA, queues=["b"])).id == plain.id
