"""Flow control's rows pruned by the worker's maintenance: keys' rows that hold nothing
any more, and the starts of rates older than any window.

Role exercised: ``ControlStore`` (``Maintenance.prune_limits``), over rows written by
``LimitControl.change_limits`` and starts recorded by ``FlowControl.acquire_limited``.
What is pruned is read back by ``prune_limits``' counts, and what is kept by
``limit_usage`` and by the acquire that goes on reading it.
"""

from __future__ import annotations

from datetime import timedelta

from pgwork._flow_control import Rate
from pgwork.adapters.limits import LimitChange, TypeUsage
from pgwork.adapters.state import FlowControl, LimitControl, Maintenance, TypeLimits
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, StateSuiteBase, requires

# Longer than any test runs: nothing recorded in a test is this old.
A_DAY = timedelta(days=1)


async def _usage(store: StateHarness) -> dict[str, TypeUsage]:
    found = await store.adapter.limit_usage(
        None, type_names=[], key_concurrency={}, rate={}, key_rate={}, keys=10
    )
    return {u.type_name: u for u in found}


async def _acquire(store: StateHarness, limits: TypeLimits, limit: int = 10) -> list[str]:
    """The limit keys of what one limited acquire of ``ALPHA`` leases, in key order."""
    turn = await store.adapter.acquire_limited(
        completions=[],
        worker_id="worker-a",
        leases={ALPHA: store.lease},
        queues=["default"],
        limit=limit,
        limits={ALPHA: limits},
    )
    return sorted(j.limit_key or "" for j in turn.acquired)


@requires(Maintenance)
class LimitPruningConformance(StateSuiteBase):
    @requires(LimitControl)
    async def test_pruning_deletes_the_key_rows_that_hold_nothing_and_keeps_the_rest(
        self, store: StateHarness
    ) -> None:
        """A key whose pause has passed or was lifted, or whose own limit was reset,
        holds nothing: its row goes. A key paused until later or with a limit of its
        own keeps its row, and so does each type's own row, empty or not."""
        change = store.adapter.change_limits

        async def write(type_name: str, key: str, *changes: LimitChange) -> None:
            for each in changes:
                await change(None, type_name=type_name, limit_key=key, change=each)

        short = LimitChange(paused_until=timedelta(seconds=0.3))
        later = LimitChange(paused_until=timedelta(hours=1))
        await write(ALPHA, "passed", short)
        await write(ALPHA, "resumed", later, LimitChange(paused_until=None))
        await write(
            ALPHA, "reset", LimitChange(key_concurrency=2), LimitChange(key_concurrency=None)
        )
        await write(ALPHA, "paused", later)
        await write(ALPHA, "own-limit", LimitChange(key_concurrency=2))
        await write(ALPHA, "own-rate", LimitChange(key_rate=Rate(5, per=timedelta(minutes=1))))
        await write(ALPHA, "", LimitChange(paused_until=None))  # the type's row, empty
        await write(BETA, "", short)  # the type's row, its pause about to pass
        usage = await _usage(store)
        await store.wait_for_store_clock(usage[ALPHA].now + timedelta(seconds=0.3))

        pruned = await store.adapter.prune_limits(starts_older_than=A_DAY)
        assert (pruned.key_rows, pruned.starts) == (3, 0)
        usage = await _usage(store)
        assert sorted(usage) == [ALPHA, BETA]
        assert [k.limit_key for k in usage[ALPHA].keys] == ["own-limit", "own-rate", "paused"]
        again = await store.adapter.prune_limits(starts_older_than=A_DAY)
        assert (again.key_rows, again.starts) == (0, 0)

    @requires(LimitControl)
    async def test_pruning_deletes_a_batch_at_most(self, store: StateHarness) -> None:
        for key in ("a", "b", "c"):
            await store.adapter.change_limits(
                None, type_name=ALPHA, limit_key=key, change=LimitChange(paused_until=None)
            )
        prune = store.adapter.prune_limits
        assert (await prune(starts_older_than=A_DAY, limit=0)).key_rows == 0
        assert (await prune(starts_older_than=A_DAY, limit=2)).key_rows == 2
        assert (await prune(starts_older_than=A_DAY, limit=2)).key_rows == 1

    @requires(LimitControl, FlowControl)
    async def test_pruning_leaves_the_acquires_cursor_where_it_was(
        self, store: StateHarness
    ) -> None:
        """The fairness cursor is kept in the type's row, which no pruning deletes: the
        next acquire goes on after the key served last, not from the first key."""
        await store.seed(*(store.new_job(limit_key=k, limit_group=k) for k in "abcdabcd"))
        keyed = TypeLimits(key_concurrency=10)
        assert await _acquire(store, keyed, limit=2) == ["a", "b"]
        await store.adapter.change_limits(
            None, type_name=ALPHA, limit_key="a", change=LimitChange(paused_until=None)
        )
        assert (await store.adapter.prune_limits(starts_older_than=A_DAY)).key_rows == 1
        assert await _acquire(store, keyed, limit=1) == ["c"]

    @requires(FlowControl)
    async def test_pruning_deletes_only_the_starts_older_than_it_is_told(
        self, store: StateHarness
    ) -> None:
        """A start is kept while a window may count it: the rate still holds the next
        job back after a pruning with the longest window. Pruned as older than a
        shorter time (here, less than the rate's hour: a store takes the caller's word),
        it counts no more, and the next job starts."""
        await store.seed(store.new_job(limit_group=""), store.new_job(limit_group=""))
        once_an_hour = TypeLimits(rate_n=1, rate_per_s=3600.0)
        assert len(await _acquire(store, once_an_hour)) == 1
        started_by = await store.adapter.now()

        kept = await store.adapter.prune_limits(starts_older_than=A_DAY)
        assert (kept.key_rows, kept.starts) == (0, 0)
        assert await _acquire(store, once_an_hour) == []

        await store.wait_for_store_clock(started_by + timedelta(seconds=0.3))
        pruned = await store.adapter.prune_limits(starts_older_than=timedelta(seconds=0.2))
        assert pruned.starts == 1
        assert len(await _acquire(store, once_an_hour)) == 1
