"""``StateAdapterConformance``: every part of the state suite in one class."""

from __future__ import annotations

from pgwork.testing.conformance._state_acquire import AcquireConformance
from pgwork.testing.conformance._state_atomic_group import AtomicGroupConformance
from pgwork.testing.conformance._state_blockers import BlockerConformance
from pgwork.testing.conformance._state_complete import CompleteConformance, FailConformance
from pgwork.testing.conformance._state_control import ControlConformance
from pgwork.testing.conformance._state_debounce import DebounceConformance
from pgwork.testing.conformance._state_dedup import DedupConformance
from pgwork.testing.conformance._state_deletion import DeletionConformance, RetentionConformance
from pgwork.testing.conformance._state_enqueue import EnqueueConformance
from pgwork.testing.conformance._state_fan_out import FanOutConformance
from pgwork.testing.conformance._state_flow import FlowConformance
from pgwork.testing.conformance._state_history import AttemptHistoryConformance
from pgwork.testing.conformance._state_insight import InsightConformance
from pgwork.testing.conformance._state_job_history import JobHistoryConformance
from pgwork.testing.conformance._state_lease import LeaseConformance
from pgwork.testing.conformance._state_lending import TransactionLendingConformance
from pgwork.testing.conformance._state_limit_control import LimitControlConformance
from pgwork.testing.conformance._state_limit_pruning import LimitPruningConformance
from pgwork.testing.conformance._state_queries import QueryConformance
from pgwork.testing.conformance._state_reap import AtomicConformance, ReapConformance
from pgwork.testing.conformance._state_registry import RegistryConformance
from pgwork.testing.conformance._state_signals import SignalConformance
from pgwork.testing.conformance._state_turn import TurnConformance
from pgwork.testing.conformance._state_waiting import WaitingConformance
from pgwork.testing.conformance._state_work import WorkConformance

__all__ = ["StateAdapterConformance"]


class StateAdapterConformance(
    EnqueueConformance,
    AcquireConformance,
    LeaseConformance,
    CompleteConformance,
    TurnConformance,
    FlowConformance,
    LimitControlConformance,
    LimitPruningConformance,
    FailConformance,
    AttemptHistoryConformance,
    ReapConformance,
    AtomicConformance,
    AtomicGroupConformance,
    TransactionLendingConformance,
    DedupConformance,
    DebounceConformance,
    BlockerConformance,
    FanOutConformance,
    SignalConformance,
    WaitingConformance,
    ControlConformance,
    QueryConformance,
    InsightConformance,
    WorkConformance,
    JobHistoryConformance,
    DeletionConformance,
    RetentionConformance,
    RegistryConformance,
):
    """Subclass with a ``state_adapter`` fixture to run the whole state suite.

    The fixture yields an adapter on a fresh, empty store and closes it afterwards.
    Optional: a ``lock_waiters`` fixture (see ``StateSuiteBase.lock_waiters``) and the
    timing knobs ``short_lease``, ``expiry_timeout``, ``blocking_grace``,
    ``short_retention`` and ``short_silence``.
    """
