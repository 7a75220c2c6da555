"""Instrumenting any state adapter at the seam: start/stop/error and a duration per call.

``InstrumentedStateAdapter`` forwards every operation unchanged to the adapter it
wraps, so it passes the same conformance suite, and emits ``adapter.call.start`` before
and ``adapter.call.stop`` (or ``adapter.call.error``) after each one.
``transaction()`` and ``atomic_transaction()`` are measured from entering to leaving
the block.

It offers what the adapter it wraps offers, no more: the core of the contract always,
and each capability (and ``adopt_sync``) only when the wrapped adapter has it. The
client and the worker ask once which capabilities a store offers
(``Capabilities.of``, a runtime ``isinstance`` against each protocol) and take another
path for one it lacks; a wrapper that claimed them all would send them to an operation
the store does not have. A wrapper of a store that lacks some is an instance of a
subclass in which their operations are None, which such a check takes for missing.

The wrappers are made from the protocol's own operations (``_timed(StateAdapter.acquire)``
is the wrapper of ``acquire``, typed exactly as the protocol declares it), so no
signature is written twice; mypy checks below that the wrapper is a whole
``StateAdapter``, and a test that every operation of the protocol is wrapped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar, cast

from pgwork.adapters.capabilities import CAPABILITY_PROTOCOLS, operations
from pgwork.adapters.state import (
    CoreStateAdapter,
    StateAdapter,
    SyncAdopter,
    TransactionHandle,
    TransactionLoan,
)
from pgwork.errors import ConfigurationError
from pgwork.observability._events import (
    ADAPTER_CALL_ERROR,
    ADAPTER_CALL_START,
    ADAPTER_CALL_STOP,
    Observer,
)
from pgwork.observability.emitter import Emitter

__all__ = ["InstrumentedStateAdapter"]

Call = TypeVar("Call", bound=Callable[..., Coroutine[Any, Any, Any]])
Block = TypeVar("Block", bound=Callable[..., AbstractAsyncContextManager[Any]])


def _timed(operation: Call) -> Call:
    """The wrapper of ``operation`` (a protocol method): the same call on ``inner``,
    between a start event and a stop (or error) event with its duration."""
    name = operation.__name__

    async def timed(self: InstrumentedStateAdapter, /, *args: Any, **kwargs: Any) -> Any:
        emit = self._events.emit
        emit(ADAPTER_CALL_START, operation=name)
        started = time.monotonic()
        try:
            result = await getattr(self.inner, name)(*args, **kwargs)
        except BaseException as exc:
            _error(emit, name, started, exc)
            raise
        emit(ADAPTER_CALL_STOP, operation=name, duration_s=time.monotonic() - started)
        return result

    timed.__name__ = timed.__qualname__ = name
    timed.__doc__ = operation.__doc__
    return cast(Call, timed)


def _timed_block(operation: Block) -> Block:
    """``_timed`` for an operation that opens a block (``async with``): timed from
    entering it to leaving it."""
    name = operation.__name__

    @asynccontextmanager
    async def timed(
        self: InstrumentedStateAdapter, /, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        emit = self._events.emit
        emit(ADAPTER_CALL_START, operation=name)
        started = time.monotonic()
        try:
            async with getattr(self.inner, name)(*args, **kwargs) as value:
                yield value
        except BaseException as exc:
            _error(emit, name, started, exc)
            raise
        emit(ADAPTER_CALL_STOP, operation=name, duration_s=time.monotonic() - started)

    timed.__name__ = timed.__qualname__ = name
    timed.__doc__ = operation.__doc__
    return cast(Block, timed)


def _error(emit: Callable[..., None], name: str, started: float, exc: BaseException) -> None:
    emit(
        ADAPTER_CALL_ERROR,
        operation=name,
        duration_s=time.monotonic() - started,
        error_type=type(exc).__name__,
        error_message=str(exc),
    )


class InstrumentedStateAdapter:
    """Wrap ``inner`` so every call is reported to ``observers``.

    Pass it as ``state_adapter`` to ``create_client``; ``inner`` keeps its pool and is
    closed through the wrapper. An atomic group's own steps are not instrumented: they
    are its members' round trips (``open_atomic_group`` is).

    The wrapper offers the capabilities ``inner`` offers and no other: around a store
    with only the core of the contract, ``Capabilities.of(wrapper)`` finds none, and the
    client and the worker do without them as they would on the store itself. Its type
    is the whole ``StateAdapter`` (one class wraps every store); what it offers is
    asked of it at run time, as of any store.
    """

    def __new__(
        cls, inner: CoreStateAdapter, *, observers: Iterable[Observer]
    ) -> InstrumentedStateAdapter:
        lacking = frozenset(p for p in _OPTIONAL if not isinstance(inner, p))
        return super().__new__(_without(cls, lacking))

    def __init__(self, inner: CoreStateAdapter, *, observers: Iterable[Observer]) -> None:
        self.inner = inner
        self._events = Emitter(observers)

    def adopt_sync(self, tx: object) -> TransactionHandle:
        """The wrapped adapter's ``adopt_sync`` (the client's ``*_sync`` calls),
        reported as ``adopt``."""
        inner = self.inner
        if not isinstance(inner, SyncAdopter):
            raise ConfigurationError(
                f"{type(inner).__name__} cannot adopt a blocking connection; use the async calls"
            )
        emit = self._events.emit
        emit(ADAPTER_CALL_START, operation="adopt")
        started = time.monotonic()
        try:
            handle = inner.adopt_sync(tx)
        except BaseException as exc:
            _error(emit, "adopt", started, exc)
            raise
        emit(ADAPTER_CALL_STOP, operation="adopt", duration_s=time.monotonic() - started)
        return handle

    def lend_transaction(
        self, tx: TransactionHandle, *, check: Callable[[], None]
    ) -> TransactionLoan:
        """The wrapped adapter's ``lend_transaction`` (``TransactionLending``): no I/O,
        and the loan's statements are the handler's own, so it is not reported."""
        return cast(StateAdapter, self.inner).lend_transaction(tx, check=check)

    def __repr__(self) -> str:
        return f"InstrumentedStateAdapter({self.inner!r})"

    # The core: Store
    verify = _timed(StateAdapter.verify)
    close = _timed(StateAdapter.close)
    transaction = _timed_block(StateAdapter.transaction)
    adopt = _timed(StateAdapter.adopt)

    # EnqueueStore
    insert_jobs = _timed(StateAdapter.insert_jobs)
    mark_chain_awaited = _timed(StateAdapter.mark_chain_awaited)

    # WorkerCore
    acquire = _timed(StateAdapter.acquire)
    renew = _timed(StateAdapter.renew)
    complete = _timed(StateAdapter.complete)
    fail = _timed(StateAdapter.fail)
    reschedule = _timed(StateAdapter.reschedule)
    release = _timed(StateAdapter.release)
    reap = _timed(StateAdapter.reap)

    # ReadCore
    now = _timed(StateAdapter.now)
    get_jobs = _timed(StateAdapter.get_jobs)
    get_chains = _timed(StateAdapter.get_chains)
    list_chain_jobs = _timed(StateAdapter.list_chain_jobs)
    chains_of = _timed(StateAdapter.chains_of)
    list_jobs = _timed(StateAdapter.list_jobs)
    list_chains = _timed(StateAdapter.list_chains)
    list_workers = _timed(StateAdapter.list_workers)

    # ControlCore
    cancel_chains = _timed(StateAdapter.cancel_chains)
    retry_failed = _timed(StateAdapter.retry_failed)
    trigger = _timed(StateAdapter.trigger)
    set_queue_paused = _timed(StateAdapter.set_queue_paused)
    delete_chains = _timed(StateAdapter.delete_chains)

    # WorkerRegistry
    register_worker = _timed(StateAdapter.register_worker)
    heartbeat = _timed(StateAdapter.heartbeat)
    find_dead_workers = _timed(StateAdapter.find_dead_workers)

    # The capabilities: BatchedTurns, FlowControl, LimitControl, DueTimes,
    # AtomicAttempts, AtomicGroupCommit, InLineRenewal, ChainBlockers, Debouncing,
    # ChainSignals (TransactionLending is ``lend_transaction`` above)
    complete_and_acquire = _timed(StateAdapter.complete_and_acquire)
    acquire_limited = _timed(StateAdapter.acquire_limited)
    change_limits = _timed(StateAdapter.change_limits)
    limit_usage = _timed(StateAdapter.limit_usage)
    next_due = _timed(StateAdapter.next_due)
    begin_atomic = _timed(StateAdapter.begin_atomic)
    atomic_transaction = _timed_block(StateAdapter.atomic_transaction)
    complete_atomic = _timed(StateAdapter.complete_atomic)
    open_atomic_group = _timed(StateAdapter.open_atomic_group)
    renew_in_line = _timed(StateAdapter.renew_in_line)
    blocker_outputs = _timed(StateAdapter.blocker_outputs)
    resolve_dependants = _timed(StateAdapter.resolve_dependants)
    sweep_blocked = _timed(StateAdapter.sweep_blocked)
    debounce_jobs = _timed(StateAdapter.debounce_jobs)
    send_signals = _timed(StateAdapter.send_signals)
    match_signals = _timed(StateAdapter.match_signals)
    sweep_signals = _timed(StateAdapter.sweep_signals)
    received_signal = _timed(StateAdapter.received_signal)
    prune_signals = _timed(StateAdapter.prune_signals)

    # OperatorViews
    count_jobs = _timed(StateAdapter.count_jobs)
    list_blocked_jobs = _timed(StateAdapter.list_blocked_jobs)
    list_blockers = _timed(StateAdapter.list_blockers)
    recent_activity = _timed(StateAdapter.recent_activity)
    chain_links = _timed(StateAdapter.chain_links)
    list_work = _timed(StateAdapter.list_work)
    running_by_worker = _timed(StateAdapter.running_by_worker)
    pending_types = _timed(StateAdapter.pending_types)
    error_groups = _timed(StateAdapter.error_groups)
    jobs_in_id_range = _timed(StateAdapter.jobs_in_id_range)
    scan_input = _timed(StateAdapter.scan_input)
    job_history = _timed(StateAdapter.job_history)
    chain_waits = _timed(StateAdapter.chain_waits)
    list_waiting = _timed(StateAdapter.list_waiting)
    list_signals = _timed(StateAdapter.list_signals)

    # Maintenance
    delete_expired_chains = _timed(StateAdapter.delete_expired_chains)
    roll_up_history = _timed(StateAdapter.roll_up_history)
    prune_workers = _timed(StateAdapter.prune_workers)
    prune_limits = _timed(StateAdapter.prune_limits)


# The protocols whose operations the wrapper offers only when the adapter it wraps does.
_OPTIONAL: tuple[type, ...] = (*CAPABILITY_PROTOCOLS, SyncAdopter)

_WrapperClass = type[InstrumentedStateAdapter]
_classes: dict[tuple[_WrapperClass, frozenset[type]], _WrapperClass] = {}


def _without(cls: _WrapperClass, lacking: frozenset[type]) -> _WrapperClass:
    """``cls`` with the operations of the ``lacking`` protocols set to None, made once
    for each set of them.

    A runtime check against a protocol takes an operation that is None for a missing
    one, but it asks the class first: None on the instance alone would not hide the
    class's wrapper.
    """
    if not lacking:
        return cls
    made = _classes.get((cls, lacking))
    if made is None:
        hidden = {name: None for protocol in lacking for name in operations(protocol)}
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, **hidden}
        made = _classes[cls, lacking] = cast(_WrapperClass, type(cls.__name__, (cls,), namespace))
    return made


def _conforms(adapter: InstrumentedStateAdapter) -> StateAdapter:
    """mypy checks here that the wrapper still satisfies the whole protocol."""
    return adapter
