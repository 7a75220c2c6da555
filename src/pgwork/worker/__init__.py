"""The in-process worker: ``create_in_process_worker`` and the ``Attempt`` (async
handlers) or ``SyncAttempt`` (sync handlers) they see."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from pgwork._limits import check_queue_name, check_seconds
from pgwork.client import Client
from pgwork.errors import ConfigurationError
from pgwork.job_types import JobType
from pgwork.observability import Observer
from pgwork.schedules import CronSchedule
from pgwork.worker._attempt import Attempt
from pgwork.worker._build import build
from pgwork.worker._gc import tune_gc
from pgwork.worker._loop import Handler, InProcessWorker, Processor
from pgwork.worker._process_handlers import ProcessHandler
from pgwork.worker._side.maintenance import DEFAULT_SIGNAL_RETENTION
from pgwork.worker._sync import SyncAttempt, SyncHandler
from pgwork.worker.middleware import Middleware

__all__ = [
    "Attempt",
    "Handler",
    "InProcessWorker",
    "SyncAttempt",
    "SyncHandler",
    "create_in_process_worker",
    "tune_gc",
]


def _seconds(value: float | timedelta, name: str) -> float:
    return check_seconds(name, value, where="the worker")


def create_in_process_worker(
    *,
    client: Client,
    processors: Mapping[JobType[Any, Any] | str, Processor] | None = None,
    max_slots: int = 10,
    worker_id: str | None = None,
    poll_interval: float | timedelta = 2.0,
    queues: Sequence[str] | None = None,
    middlewares: Sequence[Middleware] = (),
    grace_period: float | timedelta = 10.0,
    rng: random.Random | None = None,
    observers: Sequence[Observer] | None = None,
    schedules: Sequence[CronSchedule[Any]] = (),
    heartbeat_interval: float = 5.0,
    dead_worker_after: float = 30.0,
    abandon_after: float | timedelta = 5.0,
    prefetch: int | None = None,
    atomic_group: int = 1,
    atomic_group_wait: float | timedelta = 0.005,
    type_slots: Mapping[JobType[Any, Any] | str, int] | None = None,
    sync_threads: int | None = None,
    process_handlers: Mapping[JobType[Any, Any] | str, ProcessHandler] | None = None,
    processes: int | None = None,
    signal_retention: timedelta = DEFAULT_SIGNAL_RETENTION,
) -> InProcessWorker:
    """Build a worker that runs ``processors`` ({job_type: handler}) in up to
    ``max_slots`` concurrent attempts. A handler is an ``async def`` (given an
    ``Attempt``) or a plain ``def`` (given a ``SyncAttempt``), which runs on one of the
    worker's own threads and counts in ``max_slots`` as well; ``sync_threads``: how
    many (default None: ``max_slots``, started as they are needed). Fewer than
    ``max_slots`` makes sync handlers beyond them wait for a thread in their slot, their
    timeout running. A sync handler of an atomic type writes through a blocking
    connection in the job's transaction (``SyncAttempt.connection``); a worker with
    ``atomic_group`` > 1, or on a store that cannot lend its transactions, refuses one
    (``AtomicSyncHandlerError``); see docs/sync.md.

    ``process_handlers``: ``{job_type: handler}`` for CPU-bound types, each handler a
    plain ``def handler(input) -> output`` at the top level of a module, run in one of
    the worker's own processes (``processes`` of them, default: the CPU cores, at most
    ``max_slots``; started with the worker, ready before it takes a job), its input
    and output crossing as the JSON the database stores. It counts in ``max_slots``;
    its timeout, a cancel or a stop kill its process, and a process that dies fails
    that attempt only. What cannot run there is refused here (``ProcessHandlerError``);
    see docs/sync.md.

    ``queues``: queues to take jobs from, drained strictly in the given order (default:
    the queues of the processed types). ``poll_interval``: the longest the worker waits
    without a notification. ``grace_period``: how long ``stop()`` lets in-flight
    attempts finish before aborting them and handing their jobs back. ``abandon_after``:
    how long a handler that was cancelled (timeout, lost lease, stop) may take to end
    before the worker abandons it: frees its slot, stops renewing its lease and fails
    the attempt (a job type's own ``abandon_after`` wins). ``prefetch``: how many jobs
    beyond the free slots the worker may hold acquired, waiting for a slot, so that its
    next acquire overlaps the running handlers (default None: up to ``max_slots`` while
    handlers take under 20 ms on average, none otherwise; 0 turns it off). ``middlewares``
    wrap every attempt, first = outermost. ``atomic_group``: how many atomic attempts
    may share one transaction and its commit, each in a savepoint of its own (default
    1: a transaction per attempt); a group commits when full or ``atomic_group_wait``
    (seconds) after its first attempt finished; a crash before the commit runs every
    attempt of the group again (see docs/workers.md). ``rng`` seeds backoff jitter (tests).
    ``heartbeat_interval`` / ``dead_worker_after`` (seconds): how often the worker
    records that it is alive, and after how long without a heartbeat another worker
    takes back all of a worker's running jobs. ``schedules``: recurring
    ``CronSchedule``s this worker fires (every worker may carry the same ones: each
    tick is enqueued once). ``observers``: receive the worker's
    events (default: the client's observers). ``type_slots``: ``{job_type: n}``, the
    most attempts of that type this worker runs (or holds prefetched) at once, beside
    ``max_slots`` (for a memory- or CPU-heavy type); a job type's ``concurrency``
    limits what every worker runs together. ``signal_retention``: how long a signal
    no step has taken is kept for the next step that waits for its name (default seven
    days); the worker's maintenance deletes older ones (docs/chains.md, "Waiting for a
    signal").
    """
    poll_s = _seconds(poll_interval, "poll_interval")
    grace_s = _seconds(grace_period, "grace_period")
    abandon_s = _seconds(abandon_after, "abandon_after")
    if max_slots < 1:
        raise ConfigurationError(f"max_slots must be >= 1, got {max_slots}")
    if poll_s <= 0:
        raise ConfigurationError(f"poll_interval must be positive, got {poll_s}")
    if grace_s < 0:
        raise ConfigurationError(f"grace_period must not be negative, got {grace_s}")
    if abandon_s < 0:
        raise ConfigurationError(f"abandon_after must not be negative, got {abandon_s}")
    if prefetch is not None and prefetch < 0:
        raise ConfigurationError(f"prefetch must not be negative, got {prefetch}")
    if not processors and not process_handlers:
        raise ConfigurationError(
            "processors is empty: give at least one {job_type: handler} (in processors, "
            "or in process_handlers)"
        )
    for queue in queues or ():
        check_queue_name(queue, where="the worker's queues")
    for key, cap in (type_slots or {}).items():
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            name = key if isinstance(key, str) else key.name
            raise ConfigurationError(
                f"type_slots[{name!r}] must be a whole number of attempts >= 1, got {cap!r}"
            )
    if sync_threads is not None and (
        isinstance(sync_threads, bool) or not isinstance(sync_threads, int) or sync_threads < 1
    ):
        raise ConfigurationError(
            f"sync_threads must be a whole number of threads >= 1, got {sync_threads!r}"
        )
    if not isinstance(signal_retention, timedelta) or signal_retention <= timedelta(0):
        raise ConfigurationError(
            f"signal_retention must be a positive timedelta, got {signal_retention!r}"
        )
    if processes is not None and (
        isinstance(processes, bool) or not isinstance(processes, int) or processes < 1
    ):
        raise ConfigurationError(
            f"processes must be a whole number of processes >= 1, got {processes!r}"
        )
    return build(
        client=client,
        processors=processors or {},
        max_slots=max_slots,
        worker_id=worker_id,
        poll_interval=poll_s,
        queues=queues,
        middlewares=middlewares,
        grace_period=grace_s,
        rng=rng,
        observers=observers,
        schedules=schedules,
        heartbeat_interval=_seconds(heartbeat_interval, "heartbeat_interval"),
        dead_worker_after=_seconds(dead_worker_after, "dead_worker_after"),
        abandon_after=abandon_s,
        prefetch=prefetch,
        atomic_group=atomic_group,
        atomic_group_wait=_seconds(atomic_group_wait, "atomic_group_wait"),
        type_slots=type_slots,
        sync_threads=sync_threads,
        process_handlers=process_handlers,
        processes=processes,
        signal_retention=signal_retention,
    )
