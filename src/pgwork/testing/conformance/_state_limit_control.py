"""Flow limits changed at run time: overrides and pauses kept per type and per key, and
read back with the jobs that run and wait against them.

Role exercised: ``ControlStore`` (``LimitControl``: ``change_limits``,
``limit_usage``). A limited type's jobs carry their limit group (``NewJob.limit_group``:
the key, or '' for none). The attempts a rate counts are those ``acquire_limited``
started (``FlowControl``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta

from pgwork._flow_control import Rate
from pgwork.adapters.limits import LimitChange, Limits, TypeUsage
from pgwork.adapters.state import (
    AcquiredJob,
    Completion,
    FlowControl,
    LimitControl,
    TypeLimits,
    WorkerInfo,
)
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, StateSuiteBase, requires
from pgwork.testing.conformance._rollback import rolled_back

AN_HOUR = Rate(10, per=timedelta(hours=1))


async def _usage(
    store: StateHarness,
    *names: str,
    keys: int = 10,
    key_concurrency: Mapping[str, int] | None = None,
    rate: Mapping[str, Rate] | None = None,
    key_rate: Mapping[str, Rate] | None = None,
) -> dict[str, TypeUsage]:
    found = await store.adapter.limit_usage(
        None,
        type_names=list(names),
        key_concurrency=key_concurrency or {},
        rate=rate or {},
        key_rate=key_rate or {},
        keys=keys,
    )
    return {u.type_name: u for u in found}


async def _start(store: StateHarness, limits: TypeLimits) -> list[AcquiredJob]:
    """Start what ``limits`` lets start of ``ALPHA``'s ready jobs, as a worker does."""
    turn = await store.adapter.acquire_limited(
        completions=[],
        worker_id="worker-a",
        leases={ALPHA: store.lease},
        queues=["default"],
        limit=10,
        limits={ALPHA: limits},
    )
    return turn.acquired


def _per_s(rate: Rate) -> float:
    return rate.per.total_seconds()


@requires(LimitControl)
class LimitControlConformance(StateSuiteBase):
    async def test_a_change_sets_what_it_names_and_keeps_the_rest(
        self, store: StateHarness
    ) -> None:
        """Each limit given is set, each left out kept, each given None cleared; a key's
        row is a row of its own."""
        change = store.adapter.change_limits
        every = LimitChange(
            concurrency=5,
            key_concurrency=2,
            rate=Rate(10, per=timedelta(seconds=1)),
            key_rate=Rate(3, per=timedelta(minutes=1)),
        )
        await change(None, type_name=ALPHA, limit_key="", change=every)
        await change(None, type_name=ALPHA, limit_key="", change=LimitChange(concurrency=None))
        await change(None, type_name=ALPHA, limit_key="k", change=LimitChange(key_concurrency=7))

        usage = (await _usage(store, ALPHA))[ALPHA]
        assert usage.override == Limits(
            concurrency=None,
            key_concurrency=2,
            rate=Rate(10, per=timedelta(seconds=1)),
            key_rate=Rate(3, per=timedelta(minutes=1)),
        )
        assert [(k.limit_key, k.override) for k in usage.keys] == [("k", Limits(key_concurrency=7))]

    async def test_a_change_in_a_transaction_is_kept_only_if_it_commits(
        self, store: StateHarness
    ) -> None:
        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.change_limits(
                tx, type_name=ALPHA, limit_key="", change=LimitChange(concurrency=3)
            )
        assert ALPHA not in await _usage(store)
        async with store.adapter.transaction() as tx:
            await store.adapter.change_limits(
                tx, type_name=ALPHA, limit_key="", change=LimitChange(concurrency=3)
            )
        assert (await _usage(store))[ALPHA].override.concurrency == 3

    async def test_a_pause_is_read_until_it_has_passed(self, store: StateHarness) -> None:
        """A pause for a duration ends that long after now on the store's clock; once
        it has passed it reads as no pause."""
        before = await store.adapter.now()
        await store.adapter.change_limits(
            None,
            type_name=ALPHA,
            limit_key="",
            change=LimitChange(paused_until=timedelta(seconds=0.5)),
        )
        paused = (await _usage(store, ALPHA))[ALPHA].paused_until
        assert paused is not None
        assert before + timedelta(seconds=0.5) <= paused <= before + timedelta(seconds=30)
        await store.wait_for_store_clock(paused)
        assert (await _usage(store, ALPHA))[ALPHA].paused_until is None

    async def test_an_extending_pause_keeps_the_longer_one(self, store: StateHarness) -> None:
        """Two attempts pausing one key at once leave the later end, whichever writes
        last; a plain pause replaces it, and None lifts it."""
        change = store.adapter.change_limits

        async def pause(after: timedelta | None, *, extend: bool) -> None:
            await change(
                None,
                type_name=ALPHA,
                limit_key="k",
                change=LimitChange(paused_until=after, extend_pause=extend),
            )

        async def paused_for() -> timedelta | None:
            usage = (await _usage(store, ALPHA))[ALPHA]
            until = [k.paused_until for k in usage.keys if k.limit_key == "k"]
            if not until or until[0] is None:
                return None
            return until[0] - usage.now

        await pause(timedelta(hours=2), extend=True)
        await pause(timedelta(minutes=1), extend=True)
        assert (await paused_for() or timedelta(0)) > timedelta(hours=1)
        await pause(timedelta(minutes=1), extend=False)
        assert (await paused_for() or timedelta(0)) < timedelta(hours=1)
        await pause(None, extend=False)
        assert await paused_for() is None

    async def test_usage_counts_the_limited_jobs_running_and_due(self, store: StateHarness) -> None:
        """Running and due pending jobs of the type's limit groups; jobs scheduled
        later, and jobs without a group (of a type enqueued before it was limited), are
        not counted. The keys closest to their limit come back with their counts."""
        await store.seed(*(store.new_job(limit_key="a", limit_group="a") for _ in range(3)))
        await store.seed(store.new_job(limit_key="b", limit_group="b"))
        await store.seed(
            store.new_job(limit_key="b", limit_group="b", run_after=timedelta(hours=1))
        )
        await store.seed(store.new_job())
        held = await store.acquire(ALPHA, limit=10)
        assert len(held) == 5
        await store.seed(*(store.new_job(limit_key="a", limit_group="a") for _ in range(2)))

        usage = (await _usage(store, ALPHA))[ALPHA]
        assert (usage.running, usage.pending) == (4, 2)
        assert {(k.limit_key, k.running, k.pending) for k in usage.keys} == {
            ("a", 3, 2),
            ("b", 1, 0),
        }

    async def test_usage_ranks_keys_by_how_close_they_are_to_their_limit(
        self, store: StateHarness
    ) -> None:
        """With one key wanted, the one nearest its limit: ``a`` runs two of its own
        limit of two, ``b`` three of the type's per-key ten. A paused key comes back
        beside it though nothing of it runs."""
        await store.seed(*(store.new_job(limit_key="a", limit_group="a") for _ in range(2)))
        await store.seed(*(store.new_job(limit_key="b", limit_group="b") for _ in range(3)))
        assert len(await store.acquire(ALPHA, limit=10)) == 5
        change = store.adapter.change_limits
        await change(None, type_name=ALPHA, limit_key="a", change=LimitChange(key_concurrency=2))
        await change(
            None,
            type_name=ALPHA,
            limit_key="quiet",
            change=LimitChange(paused_until=timedelta(hours=1)),
        )
        found = (await _usage(store, ALPHA, key_concurrency={ALPHA: 10}, keys=1))[ALPHA]
        assert [(k.limit_key, k.running) for k in found.keys] == [("a", 2), ("quiet", 0)]
        assert found.keys[1].paused_until is not None

    @requires(FlowControl)
    async def test_usage_counts_the_attempts_started_in_each_rates_window(
        self, store: StateHarness
    ) -> None:
        """A type's rate counts every attempt of the type started in its window,
        whatever its key; a key rate those of the key alone (the jobs without a key
        are a group of their own). Without a rate there is no count: None."""
        for key in ("a", "a", "b", None):
            await store.seed(store.new_job(limit_key=key, limit_group=key or ""))
        limits = TypeLimits(
            key_concurrency=10,
            rate_n=AN_HOUR.n,
            rate_per_s=_per_s(AN_HOUR),
            key_rate_n=5,
            key_rate_per_s=_per_s(AN_HOUR),
        )
        assert len(await _start(store, limits)) == 4

        rated = (
            await _usage(
                store,
                ALPHA,
                rate={ALPHA: AN_HOUR},
                key_rate={ALPHA: Rate(5, per=AN_HOUR.per)},
            )
        )[ALPHA]
        assert rated.started == 4
        assert {(k.limit_key, k.running, k.started) for k in rated.keys} == {
            ("a", 2, 2),
            ("b", 1, 1),
            (None, 1, 1),
        }
        unrated = (await _usage(store, ALPHA, key_concurrency={ALPHA: 10}))[ALPHA]
        assert unrated.started is None
        assert {k.started for k in unrated.keys} == {None}

    @requires(FlowControl)
    async def test_usage_counts_starts_in_the_window_of_the_effective_rate(
        self, store: StateHarness
    ) -> None:
        """An override's window replaces the declared one, and a key's own key rate
        the type's per-key one: once half a second has passed, the starts have left
        the overridden windows, and remain in the declared hour of the others."""
        for key in ("a", "a", "b"):
            await store.seed(store.new_job(limit_key=key, limit_group=key))
        hour = _per_s(AN_HOUR)
        limits = TypeLimits(rate_n=10, rate_per_s=hour, key_rate_n=5, key_rate_per_s=hour)
        assert len(await _start(store, limits)) == 3
        short = Rate(10, per=timedelta(seconds=0.5))
        change = store.adapter.change_limits
        await change(None, type_name=ALPHA, limit_key="", change=LimitChange(rate=short))
        await change(None, type_name=ALPHA, limit_key="a", change=LimitChange(key_rate=short))

        async def read() -> TypeUsage:
            found = await _usage(
                store, ALPHA, rate={ALPHA: AN_HOUR}, key_rate={ALPHA: Rate(5, per=AN_HOUR.per)}
            )
            return found[ALPHA]

        before = await read()
        assert before.started == 3
        await store.wait_for_store_clock(before.now + short.per)
        after = await read()
        assert after.started == 0
        assert {(k.limit_key, k.started) for k in after.keys} == {("a", 0), ("b", 1)}

    @requires(FlowControl)
    async def test_usage_ranks_a_key_at_its_rate_among_the_closest(
        self, store: StateHarness
    ) -> None:
        """With one key wanted, the one nearest a limit: ``a`` runs nothing now but
        started two of its two an hour; ``b`` runs one of its ten, started one of two."""
        for key in ("a", "a", "b"):
            await store.seed(store.new_job(limit_key=key, limit_group=key))
        limits = TypeLimits(key_concurrency=10, key_rate_n=2, key_rate_per_s=_per_s(AN_HOUR))
        started = await _start(store, limits)
        assert len(started) == 3
        await store.adapter.complete(
            None,
            completions=[
                Completion(j.id, j.lease_token, json.dumps(None))
                for j in started
                if j.limit_key == "a"
            ],
        )
        found = (
            await _usage(
                store,
                ALPHA,
                keys=1,
                key_concurrency={ALPHA: 10},
                key_rate={ALPHA: Rate(2, per=AN_HOUR.per)},
            )
        )[ALPHA]
        assert [(k.limit_key, k.running, k.started) for k in found.keys] == [("a", 0, 2)]

    async def test_usage_reads_every_type_asked_for_and_every_type_with_a_row(
        self, store: StateHarness
    ) -> None:
        await store.adapter.change_limits(
            None, type_name=BETA, limit_key="", change=LimitChange(concurrency=1)
        )
        usage = await _usage(store, ALPHA)
        assert sorted(usage) == [ALPHA, BETA]
        assert usage[ALPHA].override == Limits()
        assert (usage[ALPHA].running, usage[ALPHA].pending, usage[ALPHA].keys) == (0, 0, ())

    async def test_a_change_names_the_queues_of_the_live_workers_running_the_type(
        self, store: StateHarness
    ) -> None:
        """What the client announces ready after a change: the queues its workers take
        jobs from, for the type's waiting jobs to start without a poll."""
        for worker_id, queues, types in (
            ("w-1", ("default", "bulk"), (ALPHA,)),
            ("w-2", ("other",), (BETA,)),
        ):
            await store.adapter.register_worker(
                worker=WorkerInfo(
                    id=worker_id,
                    host="h",
                    pid=1,
                    queues=queues,
                    job_types=types,
                    max_slots=1,
                )
            )
        announced = await store.adapter.change_limits(
            None, type_name=ALPHA, limit_key="", change=LimitChange(paused_until=None)
        )
        assert announced == ["bulk", "default"]

    @requires(FlowControl)
    async def test_a_change_leaves_the_acquires_cursor_as_it_was(self, store: StateHarness) -> None:
        """The fairness cursor shares the type's row: an override written after an
        acquire moved it leaves the next acquire going on from where it was."""
        await store.seed(*(store.new_job(limit_key=k, limit_group=k) for k in "abcdabcd"))
        limits = {ALPHA: TypeLimits(key_concurrency=10)}

        async def acquire(limit: int) -> list[str]:
            turn = await store.adapter.acquire_limited(
                completions=[],
                worker_id="worker-a",
                leases={ALPHA: store.lease},
                queues=["default"],
                limit=limit,
                limits=limits,
            )
            return sorted(j.limit_key or "" for j in turn.acquired)

        assert await acquire(2) == ["a", "b"]
        await store.adapter.change_limits(
            None, type_name=ALPHA, limit_key="", change=LimitChange(concurrency=100)
        )
        assert await acquire(1) == ["c"]
