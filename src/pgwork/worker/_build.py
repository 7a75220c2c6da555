"""Wiring a worker: every part made once, given what it uses when it is made.

``create_in_process_worker`` checks the options and calls ``build``. The parts are
made from the bottom up (the bell, the wakeups and the stop's deadline first, then the
batcher, the slots with their runner, the fetcher and the side tasks), so each one
receives the parts it talks to as it is constructed and nothing is assigned to a part
afterwards. What the store offers beyond the core of the contract is read here, once
(``client.capabilities``): each part is made with the capability or without it, and a
job type that cannot run without one (an atomic type on a store without
``AtomicAttempts``, a sync handler of one on a store without ``TransactionLending``)
is refused before the worker exists.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import anyio

from pgwork.adapters.state import TypeLimits, WorkerInfo
from pgwork.client import Client, limits_metadata
from pgwork.errors import AtomicSyncHandlerError, CapabilityMissingError, ConfigurationError
from pgwork.job_types import JobType
from pgwork.observability import Observer
from pgwork.observability.emitter import Emitter
from pgwork.schedules import CronSchedule
from pgwork.worker._atomic_group import atomic_groups
from pgwork.worker._batch import Acquires, CompletionBatcher
from pgwork.worker._bell import Bell
from pgwork.worker._deadline import StopDeadline
from pgwork.worker._fetch import MAX_IN_FLIGHT, Fetcher
from pgwork.worker._handlers import handler_kind, require_async
from pgwork.worker._loop import InProcessWorker, Limits, Processor
from pgwork.worker._process_handlers import ProcessHandler, on_processes, process_call
from pgwork.worker._processes import HandlerProcesses
from pgwork.worker._runner import SlotRunner
from pgwork.worker._side.heartbeat import Heartbeat
from pgwork.worker._side.maintenance import DEFAULT_SIGNAL_RETENTION, Maintenance
from pgwork.worker._side.notices import NoticeRouter
from pgwork.worker._side.reaper import Reaper
from pgwork.worker._signals import SignalMatcher
from pgwork.worker._slots import Slots
from pgwork.worker._steps import AttemptSteps
from pgwork.worker._sync import on_threads
from pgwork.worker._threads import HandlerThreads
from pgwork.worker._wakeups import Wakeups
from pgwork.worker.middleware import CallNext, Middleware, compose

__all__ = ["build", "default_worker_id"]


def build(
    *,
    client: Client,
    processors: Mapping[JobType[Any, Any] | str, Processor],
    max_slots: int,
    worker_id: str | None,
    poll_interval: float,
    queues: Sequence[str] | None,
    middlewares: Sequence[Middleware],
    grace_period: float,
    rng: random.Random | None,
    observers: Sequence[Observer] | None,
    schedules: Sequence[CronSchedule[Any]],
    heartbeat_interval: float,
    dead_worker_after: float,
    abandon_after: float,
    prefetch: int | None,
    atomic_group: int,
    atomic_group_wait: float,
    type_slots: Mapping[JobType[Any, Any] | str, int] | None = None,
    sync_threads: int | None = None,
    process_handlers: Mapping[JobType[Any, Any] | str, ProcessHandler] | None = None,
    processes: int | None = None,
    signal_retention: timedelta = DEFAULT_SIGNAL_RETENTION,
) -> InProcessWorker:
    """The worker for options ``create_in_process_worker`` has checked."""
    capabilities = client.capabilities
    worker_id = worker_id or default_worker_id()
    rng = rng or random.Random()
    # Made before the handlers, which run on it; threads start as they are needed.
    threads = HandlerThreads(
        size=max_slots if sync_threads is None else sync_threads,
        name=f"pgwork-sync-{worker_id}",
    )
    types, handlers = _resolve(client, processors, middlewares, threads, atomic_group)
    pool = None
    if process_handlers:
        pool, resolved = _in_processes(
            client,
            process_handlers,
            middlewares,
            size=min(os.cpu_count() or 1, max_slots) if processes is None else processes,
            name=f"pgwork-process-{worker_id}",
        )
        for name, job_type, call in resolved:
            if name in types:
                raise ConfigurationError(
                    f"job type {name!r} is in both processors and process_handlers: give "
                    "each type one handler"
                )
            types[name] = job_type
            handlers[name] = call
    caps = {client.registry.resolve(key).name: cap for key, cap in (type_slots or {}).items()}
    for name in caps:
        if name not in types:
            raise ConfigurationError(
                f"type_slots names {name!r}, which this worker does not process: give a cap "
                "only for a type in processors"
            )
    limits = _limits(client, types, caps)
    _check_signals(client, types)
    queues = tuple(queues) if queues else tuple(dict.fromkeys(t.queue for t in types.values()))
    for schedule in schedules:
        client.registry.entry(schedule.job_type)
    names = [schedule.name for schedule in schedules]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"schedule names must be unique, got {names}")
    events = Emitter(client.observers if observers is None else observers)

    bell = Bell()
    wakeups = Wakeups()
    deadline = StopDeadline()  # once a stop aborted what still ran: by when it is done
    stopping = anyio.Event()
    acquires = Acquires()
    matcher = (
        None
        if capabilities.signals is None
        else SignalMatcher(store=capabilities.signals, notify=client.notify)
    )
    batcher = CompletionBatcher(
        client.state,
        # A turn carries a completion for every slot: with a batch smaller than the
        # slots, the rest waited for a write of their own, and a worker of hundreds of
        # slots drained slower (python -m bench.cpu --slots 400).
        max_size=max(200, max_slots),
        # Without batched turns no acquire takes completions along: the batcher
        # writes them all, and never waits for an acquire to.
        acquires=acquires if capabilities.turns is not None else None,
        deadline=deadline,
    )
    slots = Slots(
        runner=SlotRunner(
            steps=AttemptSteps(
                client=client,
                worker_id=worker_id,
                handlers=handlers,
                batcher=batcher,
                events=events,
                rng=rng,
                abandon_after=abandon_after,
                matcher=matcher,
            ),
            groups=atomic_groups(
                state=client.state,
                opener=capabilities.atomic_groups,
                notify=client.notify,
                size=atomic_group,
                wait=atomic_group_wait,
                max_slots=max_slots,
            ),
        ),
        worker_id=worker_id,
        types=types,
        queues=queues,
        max_slots=max_slots,
        prefetch=prefetch,
        bell=bell,
        limited=list(limits),
        threads=threads,
        processes=pool,
    )
    leases = {name: t.lease for name, t in types.items()}
    return InProcessWorker(
        client=client,
        worker_id=worker_id,
        types=types,
        queues=queues,
        limits=Limits(
            max_slots=max_slots,
            poll_interval=poll_interval,
            grace_period=grace_period,
            # Staged slots count as free once their handler returns; at most this many
            # jobs may be unsettled (prefetched, handler running or outcome not yet
            # durable), so writing one batch of outcomes overlaps acquiring and running
            # the next.
            max_unsettled=2 * (max_slots + slots.admission.most_prefetched),
            # While prefetched jobs wait, acquire no fewer than this many at a time.
            least_acquire=max(1, max_slots // 2),
            shortest_lease=min(leases.values()),
        ),
        rng=rng,
        events=events,
        bell=bell,
        wakeups=wakeups,
        deadline=deadline,
        stopping=stopping,
        batcher=batcher,
        slots=slots,
        fetcher=Fetcher(
            state=client.state,
            turns=capabilities.turns,
            batcher=batcher,
            acquires=acquires,
            worker_id=worker_id,
            leases=leases,
            queues=queues,
            wakeups=wakeups,
            poll_interval=poll_interval,
            bell=bell,
            # One slot runs its jobs strictly in order: no second acquire to race the
            # first (see ``_fetch``).
            # Caps count what the worker holds: one acquire at a time, so that two in
            # flight cannot each take a cap's whole room.
            max_in_flight=1 if max_slots == 1 or caps else MAX_IN_FLIGHT,
            flow=capabilities.flow,
            limits=limits,
            caps=caps,
            held=slots.held_by_type,
            freed=slots.freed_keys,
        ),
        heartbeat=Heartbeat(
            client.state,
            WorkerInfo(
                id=worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                queues=queues,
                job_types=tuple(types),
                max_slots=max_slots,
                # What its limited types declare, for clients without them (the CLI).
                metadata=limits_metadata(types),
            ),
            interval=heartbeat_interval,
            dead_after=dead_worker_after,
            slots=slots,
            stopping=stopping,
            wakeups=wakeups,
            bell=bell,
            retry_max=poll_interval,
        ),
        reaper=Reaper(
            state=client.state,
            notify=client.notify,
            worker_id=worker_id,
            type_names=list(types),
            events=events,
            wakeups=wakeups,
            idle_interval=poll_interval,
        ),
        notices=NoticeRouter(
            worker_id=worker_id,
            queues=queues,
            wakeups=wakeups,
            bell=bell,
            events=events,
            signal_types={t.waits_for.name for t in types.values() if t.waits_for is not None},
        ),
        maintenance=Maintenance(client, schedules, signal_retention=signal_retention),
        matcher=matcher,
    )


def _resolve(
    client: Client,
    processors: Mapping[JobType[Any, Any] | str, Processor],
    middlewares: Sequence[Middleware],
    threads: HandlerThreads,
    atomic_group: int,
) -> tuple[dict[str, JobType[Any, Any]], dict[str, CallNext]]:
    """The job types the worker runs, by name, and each one's handler inside the
    middlewares (a sync handler as the awaitable that runs it on ``threads``); refuses
    a middleware that is not async, a handler that cannot run, an atomic type on a
    store without atomic attempts, and a sync handler for an atomic type on a worker
    that groups atomic attempts (``atomic_group`` > 1: the members of a group take
    turns on one connection, which a handler's thread cannot share) or on a store that
    cannot lend an attempt's transaction to a thread (without ``TransactionLending``)."""
    capabilities = client.capabilities
    for middleware in middlewares:
        require_async(middleware, "", role="middleware")
    types: dict[str, JobType[Any, Any]] = {}
    handlers: dict[str, CallNext] = {}
    for key, handler in processors.items():
        job_type = client.registry.resolve(key)
        atomic = job_type.mode == "atomic"
        if atomic and capabilities.atomic is None:
            raise CapabilityMissingError(
                "AtomicAttempts", f"the atomic job type {job_type.name!r}", capabilities.store_type
            )
        call: CallNext
        if handler_kind(handler, job_type.name) == "async":
            call = handler  # type: ignore[assignment]
        elif not atomic:
            call = on_threads(handler, threads, job_type.name)  # type: ignore[arg-type]
        elif atomic_group > 1:
            raise AtomicSyncHandlerError(job_type.name, handler, atomic_group)
        elif capabilities.lending is None:
            # Else every attempt of the type would fail, one after another, at its start.
            raise AtomicSyncHandlerError(
                job_type.name, handler, atomic_group, store_type=capabilities.store_type
            )
        else:
            lending = capabilities.lending
            call = on_threads(handler, threads, job_type.name, lending=lending)  # type: ignore[arg-type]
        types[job_type.name] = job_type
        handlers[job_type.name] = compose(middlewares, call)
    return types, handlers


def _in_processes(
    client: Client,
    process_handlers: Mapping[JobType[Any, Any] | str, ProcessHandler],
    middlewares: Sequence[Middleware],
    *,
    size: int,
    name: str,
) -> tuple[HandlerProcesses, list[tuple[str, JobType[Any, Any], CallNext]]]:
    """The worker's handler processes (``size`` of them, each loading every process
    handler as it starts), and each process handler's type and the awaitable that runs
    it there, inside the middlewares; ``ProcessHandlerError`` for a handler that cannot
    run in another process."""
    types = [(client.registry.resolve(key), handler) for key, handler in process_handlers.items()]
    calls = [(job_type, handler, process_call(job_type, handler)) for job_type, handler in types]
    processes = HandlerProcesses(
        size=size, name=name, calls=[(job_type.name, call) for job_type, _, call in calls]
    )
    resolved = []
    for job_type, handler, call in calls:
        run = on_processes(handler, processes, job_type, call, client.max_payload_bytes)
        resolved.append((job_type.name, job_type, compose(middlewares, run)))
    return processes, resolved


def _limits(
    client: Client, types: Mapping[str, JobType[Any, Any]], caps: Mapping[str, int]
) -> dict[str, TypeLimits]:
    """The limits of the job types that declare some or that this worker caps, for the
    acquire; refused on a store that cannot keep them (without ``FlowControl``)."""
    limits = {
        name: TypeLimits(
            concurrency=t.concurrency,
            key_concurrency=t.key_concurrency,
            most=caps.get(name),
            rate_n=None if t.rate is None else t.rate.n,
            rate_per_s=None if t.rate is None else t.rate.per.total_seconds(),
            key_rate_n=None if t.key_rate is None else t.key_rate.n,
            key_rate_per_s=None if t.key_rate is None else t.key_rate.per.total_seconds(),
        )
        for name, t in types.items()
        if t.limited or name in caps
    }
    capabilities = client.capabilities
    if limits and capabilities.flow is None:
        name = next(iter(limits))
        raise CapabilityMissingError(
            "FlowControl", f"the limited job type {name!r}", capabilities.store_type
        )
    return limits


def _check_signals(client: Client, types: dict[str, JobType[Any, Any]]) -> None:
    """Refuse a type that may hand its chain on to a step waiting for a signal when
    the store keeps no signals: each such hand-on would fail, attempt after attempt."""
    capabilities = client.capabilities
    if capabilities.signals is not None:
        return
    for name, job_type in types.items():
        for target in sorted(job_type.continue_with):
            if target in client.registry and client.registry.get(target).waits_for is not None:
                raise CapabilityMissingError(
                    "ChainSignals",
                    f"the job type {name!r}, which may hand on to {target!r}, a step that "
                    "waits for a signal",
                    capabilities.store_type,
                )


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{random.randbytes(2).hex()}"
