"""The worker's periodic housekeeping: recurring schedules, stuck blockers, signals
left unmatched and expired ones, the job history, retention, pruning stopped workers
and flow control's idle rows.

Runs beside the main loop. Each step is safe to run in every worker at once: schedule
ticks are deduplicated in the database, the blocker sweep locks what it settles
(SKIP LOCKED), the history's rollup locks its progress row (SKIP LOCKED) so only one
worker counts at a time, retention takes a try-lock so only one worker deletes at a
time, and pruning (of workers, keys' limit rows and rates' old starts) deletes rows it
locked with SKIP LOCKED. The rollup runs before
retention in a round, so retention rarely deletes a job the history has not counted
(when it does, it counts it itself).
A failing step is logged and retried on the next round; it never stops the worker.

The blocker sweep settles the blocked jobs whose blockers ended unsettled (a worker
killed between completing a chain and settling its dependants, a fan-out's child
among them), and the signal sweep pairs the pending signals and waiting steps a lost
match left (a worker killed between a hand-on's commit and its match, a notice never
heard): both at start, so a worker started after a crash repairs at once, and every
``sweep_every``; two workers sweeping one name take turns on its lock, and the second
finds nothing.
Signals older than ``signal_retention`` that nothing will read are deleted every
``prune_every``.

Each step but the schedules' needs a capability of the store (``ChainBlockers`` for
the blocker sweep, ``ChainSignals`` for the signals', ``Maintenance`` for the rollup,
retention and both prunings): on a store without it the step is not run. Schedule
ticks only enqueue, and run on any store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio

from pgwork._flow_control import MAX_RATE_PERIOD
from pgwork.adapters.history import HISTORY_KEEP, HISTORY_MAX_LAG
from pgwork.adapters.notify import ready_notices
from pgwork.client import Client
from pgwork.schedules import CronSchedule

log = logging.getLogger("pgwork.worker")

__all__ = [
    "DEFAULT_SIGNAL_RETENTION",
    "HISTORY_BATCH",
    "HISTORY_BATCHES_PER_ROUND",
    "LIMIT_PRUNE_BATCH",
    "LIMIT_PRUNE_BATCHES_PER_ROUND",
    "RETENTION_BATCH",
    "RETENTION_BEHIND_EVERY_S",
    "RETENTION_ROUND_S",
    "WORKER_RETENTION_S",
    "Maintenance",
]

# How long a stopped (or dead) worker stays listed by ``pgwork workers``: long enough
# to see what happened overnight, short enough that a fleet restarted on every deploy
# does not list thousands of gone workers.
WORKER_RETENTION_S = 24 * 3600.0

# Ended jobs one rollup step counts (one transaction), and the most steps a round runs
# while the history is behind (after an upgrade it counts the jobs the table holds).
HISTORY_BATCH = 10_000
HISTORY_BATCHES_PER_ROUND = 10

# Rows of flow control's one pruning step deletes of each kind (one statement), and the
# most steps a round runs while a step finds a full batch: a handler that pauses its
# key on every "429" leaves a row per key, so there can be many.
LIMIT_PRUNE_BATCH = 1000
LIMIT_PRUNE_BATCHES_PER_ROUND = 10

# How long a signal that no step took is kept for the next step that waits for its
# name (``create_in_process_worker(signal_retention=...)``): long enough for a chain
# that reaches its waiting step days after the event it waits for.
DEFAULT_SIGNAL_RETENTION = timedelta(days=7)
# Names one signal sweep matches at most, and signals one pruning step deletes.
SIGNAL_SWEEP_BATCH = 100
SIGNAL_PRUNE_BATCH = 1000

# Chains one retention step deletes (one transaction): a few thousand keep each
# transaction short (its locks are on ended chains only) and the statements per chain
# few. A round runs steps while a step comes back full, for at most RETENTION_ROUND_S,
# so the other steps and the schedules' ticks wait at most that long. The first round
# runs RETENTION_BEHIND_EVERY_S after the start; a round that ran out of time (still
# behind) is followed by the next on the loop's next tick, one that deleted a batch's
# worth or more by the next after RETENTION_BEHIND_EVERY_S (chains end at that pace),
# and each round that found less doubles the wait, up to ``retention_every``.
# ``python -m bench.retention`` measures how fast this deletes beside a drain.
RETENTION_BATCH = 5000
RETENTION_ROUND_S = 5.0
RETENTION_BEHIND_EVERY_S = 1.0


class Maintenance:
    def __init__(
        self,
        client: Client,
        schedules: Sequence[CronSchedule[Any]],
        *,
        tick: float = 1.0,
        sweep_every: float = 30.0,
        retention_every: float = 60.0,
        retention_batch: int = RETENTION_BATCH,
        retention_round: float = RETENTION_ROUND_S,
        worker_retention: float = WORKER_RETENTION_S,
        prune_every: float = 600.0,
        history_every: float = 30.0,
        history_keep: timedelta = HISTORY_KEEP,
        signal_retention: timedelta = DEFAULT_SIGNAL_RETENTION,
    ) -> None:
        self.client = client
        self.schedules = tuple(schedules)
        self.tick = tick
        self.sweep_every = sweep_every
        self.retention_every = retention_every
        self.retention_batch = retention_batch
        self.retention_round = retention_round
        # The wait before the next retention round (see RETENTION_BATCH).
        self.retention_wait = min(RETENTION_BEHIND_EVERY_S, retention_every)
        self.worker_retention = worker_retention
        self.prune_every = prune_every
        self.history_every = history_every
        self.history_keep = history_keep
        self._fired: dict[str, datetime] = {}
        self.signal_retention = signal_retention
        self._blockers = client.capabilities.blockers
        self._signals = client.capabilities.signals
        self._store = client.capabilities.maintenance
        # Signals the sweep delivered (for tests and stats).
        self.swept = 0
        self._retention = {
            t.name: t.retention for t in client.registry if not t.retention.keeps_everything
        }
        # Set by ``wind_down``: no step begins after it, a retention round ends after
        # its batch. ``_between_steps`` is set while no step runs.
        self._winding_down = anyio.Event()
        self._between_steps = anyio.Event()
        self._between_steps.set()

    async def run_forever(self) -> None:
        next_sweep = time.monotonic()  # at start: what a crash left
        next_retention = time.monotonic() + self.retention_wait
        next_prune = time.monotonic() + self.prune_every
        next_history = time.monotonic() + self.history_every
        next_signal_sweep = time.monotonic()  # at start: what a crash left
        next_signal_prune = time.monotonic() + self.prune_every
        while True:
            if self.schedules:
                await self._guarded("schedules", self.fire_due)
            now = time.monotonic()
            if self._blockers is not None and now >= next_sweep:
                next_sweep = now + self.sweep_every
                await self._guarded("blocker sweep", self.sweep)
            if self._signals is not None and now >= next_signal_sweep:
                next_signal_sweep = now + self.sweep_every
                await self._guarded("signal sweep", self.sweep_signals)
            maintained = self._store is not None
            if maintained and now >= next_history:
                next_history = now + self.history_every
                await self._guarded("history rollup", self.roll_up_history)
            if maintained and self._retention and now >= next_retention:
                await self._guarded("retention", self.purge)
                next_retention = time.monotonic() + self.retention_wait
            if maintained and now >= next_prune:
                next_prune = now + self.prune_every
                await self._guarded("worker pruning", self.prune_workers)
                await self._guarded("flow-control pruning", self.prune_limits)
            if self._signals is not None and now >= next_signal_prune:
                next_signal_prune = now + self.prune_every
                await self._guarded("signal pruning", self.prune_signals)
            await anyio.sleep(self.tick)

    async def _guarded(self, what: str, step: Any) -> None:
        if self._winding_down.is_set():
            return
        self._between_steps = anyio.Event()
        try:
            await step()
        except Exception as exc:
            log.warning("pgwork maintenance step %s failed: %r", what, exc)
        finally:
            self._between_steps.set()

    async def wind_down(self) -> None:
        """Begin no further step, and return once the one in progress ended (the
        caller bounds the wait). A step cancelled mid-statement costs its pooled
        connection: psycopg closes a connection whose query's cancellation was itself
        cancelled, and says so in two warnings at every stop that came mid-step."""
        self._winding_down.set()
        await self._between_steps.wait()

    async def fire_due(self, now: datetime | None = None) -> int:
        """Enqueue each schedule's current tick unless this worker already did; ticks
        are those due at ``now`` (default: the database clock's now)."""
        if now is None:
            now = await self.client.state.now()
        fired = 0
        for schedule in self.schedules:
            tick = schedule.due_tick(now)
            if tick is None or self._fired.get(schedule.name) == tick:
                continue
            async with self.client.state.transaction() as tx:
                started = await self.client.start_chain(
                    tx,
                    schedule.job_type,
                    schedule.input,
                    dedup=schedule.dedup(tick),
                    queue=schedule.queue,
                )
            self._fired[schedule.name] = tick
            if not started.deduplicated:
                fired += 1
                log.info(
                    "pgwork schedule %s fired for %s: chain %s",
                    schedule.name,
                    tick.isoformat(),
                    started.id,
                )
        return fired

    async def sweep(self) -> None:
        blockers = self.client.capabilities.require_blockers("the blocker sweep")
        resolution = await blockers.sweep_blocked(limit=500)
        if resolution.ready_queues or resolution.due:
            await self.client.notify.publish(
                None, notices=ready_notices(resolution.ready_queues, resolution.due)
            )

    async def sweep_signals(self) -> int:
        """Match the names that have both a pending signal and a waiting step, a batch
        at a time while a batch comes back full; announce the steps it started.
        Returns how many signals it delivered."""
        signals = self.client.capabilities.require_signals("the signal sweep")
        delivered = 0
        for _ in range(10):
            match = await signals.sweep_signals(limit=SIGNAL_SWEEP_BATCH)
            delivered += len(match.delivered)
            if match.delivered:
                await self.client.notify.publish(None, notices=ready_notices(match.ready_queues))
            if len(match.delivered) < SIGNAL_SWEEP_BATCH and not match.full:
                break
        if delivered:
            self.swept += delivered
            log.info("pgwork delivered %d signal(s) a lost match had left", delivered)
        return delivered

    async def prune_signals(self) -> int:
        """Delete the signals sent over ``signal_retention`` ago that nothing will read,
        a batch at a time while there are more; returns how many."""
        signals = self.client.capabilities.require_signals("signal pruning")
        pruned = 0
        for _ in range(LIMIT_PRUNE_BATCHES_PER_ROUND):
            step = await signals.prune_signals(
                older_than=self.signal_retention, limit=SIGNAL_PRUNE_BATCH
            )
            pruned += step
            if step < SIGNAL_PRUNE_BATCH:
                break
        if pruned:
            log.info("pgwork removed %d expired signal(s)", pruned)
        return pruned

    async def prune_workers(self) -> None:
        store = self.client.capabilities.require_maintenance("pruning stopped workers")
        pruned = await store.prune_workers(stopped_for_s=self.worker_retention)
        if pruned:
            log.info(
                "pgwork removed %d worker(s) stopped over %.0fs ago", pruned, self.worker_retention
            )

    async def prune_limits(self) -> int:
        """Delete the rows of flow control that no acquire reads any more, a batch at a
        time while there are more; returns how many.

        Keys' rows with no override, no pause to come and no waiting mark (a handler's
        ``throttle`` leaves one per key it paused), and the starts recorded for rates
        older than ``MAX_RATE_PERIOD``: no ``Rate`` can have a longer window (it refuses
        one when built), so no acquire counts them, even of a type that is no longer
        rated, whose own acquires no longer delete its starts."""
        store = self.client.capabilities.require_maintenance("pruning flow-control rows")
        pruned = 0
        for _ in range(LIMIT_PRUNE_BATCHES_PER_ROUND):
            step = await store.prune_limits(
                starts_older_than=MAX_RATE_PERIOD, limit=LIMIT_PRUNE_BATCH
            )
            pruned += step.key_rows + step.starts
            if max(step.key_rows, step.starts) < LIMIT_PRUNE_BATCH:
                break
        if pruned:
            log.info("pgwork removed %d idle flow-control row(s)", pruned)
        return pruned

    async def roll_up_history(self) -> int:
        """Count the jobs that ended since the history's progress, a batch at a time
        while it is behind; returns how many."""
        store = self.client.capabilities.require_maintenance("the history rollup")
        counted = 0
        for _ in range(HISTORY_BATCHES_PER_ROUND):
            step = await store.roll_up_history(
                limit=HISTORY_BATCH, keep=self.history_keep, max_lag=HISTORY_MAX_LAG
            )
            counted += step.jobs
            if step.skipped or step.caught_up:
                break
        return counted

    async def purge(self) -> int:
        """Delete the chains past their type's retention, a batch at a time while a
        batch comes back full and the round has time left; returns how many.

        Sets ``retention_wait``: none after a round that ran out of time with a full
        batch (more are expired: the next round runs on the loop's next tick),
        ``RETENTION_BEHIND_EVERY_S`` after one that deleted a batch's worth or more,
        else twice the last wait, up to ``retention_every``. A batch that finds
        another worker's sweep in progress deletes nothing, and this one backs off as
        if caught up."""
        store = self.client.capabilities.require_maintenance("retention")
        deadline = time.monotonic() + self.retention_round
        deleted = 0
        behind = False
        try:
            while True:
                step = await store.delete_expired_chains(
                    retention=self._retention, limit=self.retention_batch
                )
                deleted += step
                if step < self.retention_batch or self._winding_down.is_set():
                    break
                if time.monotonic() >= deadline:
                    behind = True
                    break
        finally:
            if behind:
                self.retention_wait = 0.0
            elif deleted >= self.retention_batch:
                self.retention_wait = min(RETENTION_BEHIND_EVERY_S, self.retention_every)
            else:
                self.retention_wait = min(
                    max(self.retention_wait * 2, RETENTION_BEHIND_EVERY_S), self.retention_every
                )
            if deleted:
                log.info("pgwork retention deleted %d expired chain(s)", deleted)
        return deleted
