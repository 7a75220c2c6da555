"""What waits: a chain's waiting step (``chain_waits``), the listing of waiting steps
(``list_waiting``) and of signals (``list_signals``).

A signal wait follows the match's rule: the step has not started, and is blocked (no
timeout) or pending with its timeout still to come; once the timeout has passed it
waits no longer. A job pending for a time to come that has not run sleeps; one
blocked on chains waits for its blockers, with how many have ended.

Role exercised: the waiting views of ``OperatorViews`` (with ``ChainSignals`` and
``ChainBlockers`` for the rows they read).
"""

from __future__ import annotations

from datetime import timedelta

from pgwork.adapters.state import (
    ChainBlockers,
    ChainSignals,
    OperatorViews,
    SignalFilter,
    WaitingFilter,
)
from pgwork.records import WaitKind
from pgwork.testing.conformance._harness import StateHarness, StateSuiteBase, requires
from pgwork.testing.conformance._state_signals import _send, _signal, _waiting

DAY = timedelta(days=1)


def _views(store: StateHarness) -> OperatorViews:
    adapter = store.adapter
    assert isinstance(adapter, OperatorViews)
    return adapter


@requires(OperatorViews, ChainSignals)
class WaitingConformance(StateSuiteBase):
    async def test_a_step_waiting_for_a_signal_is_a_signal_wait_until_its_timeout(
        self, store: StateHarness
    ) -> None:
        views = _views(store)
        endless = await _waiting(store, "payment:1")
        timed = await _waiting(store, "payment:2", timeout=2 * DAY)
        brief = await _waiting(store, "payment:3", timeout=timedelta(milliseconds=300))

        found = {
            w.chain_id: w
            for w in await views.chain_waits(
                None, chain_ids=[endless.chain_id, timed.chain_id, brief.chain_id]
            )
        }
        assert found[endless.chain_id].kind is WaitKind.SIGNAL
        assert found[endless.chain_id].until is None
        assert found[endless.chain_id].job_id == endless.id
        assert found[timed.chain_id].signal == "payment:2"
        until = found[timed.chain_id].until
        assert until is not None
        assert until - found[timed.chain_id].as_of > DAY

        brief_until = found[brief.chain_id].until
        assert brief_until is not None
        await store.wait_for_store_clock(brief_until)  # due now: no longer waiting
        assert await views.chain_waits(None, chain_ids=[brief.chain_id]) == []
        listed = await views.list_waiting(
            None, where=WaitingFilter(kinds=(WaitKind.SIGNAL,)), after=None, limit=10
        )
        assert [w.job_id for w in listed] == [timed.id, endless.id]
        one = await views.list_waiting(
            None, where=WaitingFilter(signal="payment:1"), after=None, limit=10
        )
        assert [w.job_id for w in one] == [endless.id]
        prefixed = await views.list_waiting(
            None, where=WaitingFilter(signal_prefix="payment:"), after=None, limit=1
        )
        assert [w.job_id for w in prefixed] == [timed.id]

    async def test_a_step_that_timed_out_and_put_itself_back_sleeps(
        self, store: StateHarness
    ) -> None:
        """Started without its signal, then put back for an hour by its attempt (which
        does not count): it waits for that time, not for the signal any more."""
        adapter, views = store.adapter, _views(store)
        step = await _waiting(store, "payment:6", timeout=timedelta(milliseconds=200))
        held = await store.acquire_when_due(queues=None, timeout=self.expiry_timeout)
        assert held.id == step.id
        assert await adapter.reschedule(
            None, lease=held.lease, run_at=None, run_after=DAY, count_attempt=False
        )

        [waits] = await views.chain_waits(None, chain_ids=[step.chain_id])
        assert (waits.kind, waits.job_id, waits.signal) == (WaitKind.SLEEP, step.id, None)
        signal_waits = await views.list_waiting(
            None, where=WaitingFilter(kinds=(WaitKind.SIGNAL,)), after=None, limit=10
        )
        assert signal_waits == []
        every = await views.list_waiting(None, where=WaitingFilter(), after=None, limit=10)
        assert [(w.kind, w.job_id) for w in every] == [(WaitKind.SLEEP, step.id)]

    async def test_a_step_that_took_its_signal_waits_no_longer(self, store: StateHarness) -> None:
        adapter, views = store.adapter, _views(store)
        assert isinstance(adapter, ChainSignals)
        step = await _waiting(store, "payment:4")
        await _send(store, _signal("payment:4"), _signal("payment:5"))
        await adapter.match_signals(names=["payment:4"])

        assert await views.chain_waits(None, chain_ids=[step.chain_id]) == []
        pending = await views.list_signals(None, where=SignalFilter(), after=None, limit=10)
        assert [s.name for s in pending] == ["payment:5"]
        every = await views.list_signals(
            None, where=SignalFilter(pending=False), after=None, limit=10
        )
        assert [(s.name, s.consumed_by) for s in every] == [
            ("payment:5", None),
            ("payment:4", step.id),
        ]

    async def test_a_job_scheduled_later_sleeps_and_a_ready_one_waits_for_nothing(
        self, store: StateHarness
    ) -> None:
        views = _views(store)
        later, ready = store.new_job(run_after=DAY), store.new_job()
        await store.seed(later, ready)

        [slept] = await views.chain_waits(None, chain_ids=[later.chain_id, ready.chain_id])
        assert (slept.kind, slept.job_id) == (WaitKind.SLEEP, later.id)
        assert slept.until is not None
        assert slept.until - slept.as_of > DAY - timedelta(minutes=1)
        sleeping = await views.list_waiting(
            None, where=WaitingFilter(kinds=(WaitKind.SLEEP,)), after=None, limit=10
        )
        assert [w.job_id for w in sleeping] == [later.id]

    @requires(ChainBlockers)
    async def test_a_job_blocked_on_chains_counts_those_that_ended(
        self, store: StateHarness
    ) -> None:
        views = _views(store)
        first, second = store.new_job(), store.new_job(run_after=DAY)
        await store.seed(first, second)
        blocked = store.new_job(blockers=[first.chain_id, second.chain_id])
        await store.seed(blocked)
        await store.finish(first.id)

        [waits] = await views.chain_waits(None, chain_ids=[blocked.chain_id])
        assert (waits.kind, waits.done, waits.total, waits.until) == (
            WaitKind.BLOCKERS,
            1,
            2,
            None,
        )
        page = await views.list_waiting(
            None, where=WaitingFilter(kinds=(WaitKind.BLOCKERS,)), after=None, limit=10
        )
        assert [w.job_id for w in page] == [blocked.id]
