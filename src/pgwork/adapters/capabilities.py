"""What a store offers beyond the core of the contract, found once.

``Capabilities.of(store)`` asks a store, once, which capability protocols of
``adapters.state`` it implements, and keeps the store itself, typed as each one it
offers (``None`` for one it lacks). The worker and the client build it when they are
built and decide from it which path to take; the hot path then holds a reference or
``None``, never an ``isinstance`` against a protocol (a runtime-checkable protocol's
check looks up every one of its operations).
"""

from __future__ import annotations

from dataclasses import dataclass

from pgwork.adapters.state import (
    AtomicAttempts,
    AtomicGroupCommit,
    BatchedTurns,
    ChainBlockers,
    ChainSignals,
    Debouncing,
    DueTimes,
    FlowControl,
    InLineRenewal,
    LimitControl,
    Maintenance,
    OperatorViews,
    TransactionLending,
)
from pgwork.errors import CapabilityMissingError

__all__ = ["CAPABILITY_PROTOCOLS", "Capabilities", "operations"]

# Every capability protocol, in the order ``Capabilities`` lists them.
CAPABILITY_PROTOCOLS: tuple[type, ...] = (
    BatchedTurns,
    FlowControl,
    LimitControl,
    DueTimes,
    AtomicAttempts,
    AtomicGroupCommit,
    TransactionLending,
    InLineRenewal,
    ChainBlockers,
    Debouncing,
    ChainSignals,
    OperatorViews,
    Maintenance,
)


def operations(protocol: type) -> frozenset[str]:
    """The operations ``protocol`` declares, its bases' included: the members a runtime
    check against it looks up."""
    return frozenset(
        name
        for klass in protocol.__mro__
        if klass is not object
        for name, value in vars(klass).items()
        if not name.startswith("_") and callable(value)
    )


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The store, once per capability it offers; ``None`` where it lacks one."""

    turns: BatchedTurns | None = None
    flow: FlowControl | None = None
    limit_control: LimitControl | None = None
    due_times: DueTimes | None = None
    atomic: AtomicAttempts | None = None
    atomic_groups: AtomicGroupCommit | None = None
    lending: TransactionLending | None = None
    in_line_renewal: InLineRenewal | None = None
    blockers: ChainBlockers | None = None
    debouncing: Debouncing | None = None
    signals: ChainSignals | None = None
    views: OperatorViews | None = None
    maintenance: Maintenance | None = None
    # The store's class name, for the errors below.
    store_type: str = "the state adapter"

    @classmethod
    def of(cls, store: object) -> Capabilities:
        """What ``store`` offers, asked once."""
        return cls(
            turns=store if isinstance(store, BatchedTurns) else None,
            flow=store if isinstance(store, FlowControl) else None,
            limit_control=store if isinstance(store, LimitControl) else None,
            due_times=store if isinstance(store, DueTimes) else None,
            atomic=store if isinstance(store, AtomicAttempts) else None,
            atomic_groups=store if isinstance(store, AtomicGroupCommit) else None,
            lending=store if isinstance(store, TransactionLending) else None,
            in_line_renewal=store if isinstance(store, InLineRenewal) else None,
            blockers=store if isinstance(store, ChainBlockers) else None,
            debouncing=store if isinstance(store, Debouncing) else None,
            signals=store if isinstance(store, ChainSignals) else None,
            views=store if isinstance(store, OperatorViews) else None,
            maintenance=store if isinstance(store, Maintenance) else None,
            store_type=type(store).__name__,
        )

    @property
    def missing(self) -> tuple[str, ...]:
        """The names of the capability protocols the store lacks."""
        names = {
            "turns": "BatchedTurns",
            "flow": "FlowControl",
            "limit_control": "LimitControl",
            "due_times": "DueTimes",
            "atomic": "AtomicAttempts",
            "atomic_groups": "AtomicGroupCommit",
            "lending": "TransactionLending",
            "in_line_renewal": "InLineRenewal",
            "blockers": "ChainBlockers",
            "debouncing": "Debouncing",
            "signals": "ChainSignals",
            "views": "OperatorViews",
            "maintenance": "Maintenance",
        }
        return tuple(name for field, name in names.items() if getattr(self, field) is None)

    def require_views(self, feature: str) -> OperatorViews:
        """The store as ``OperatorViews``, or ``CapabilityMissingError`` for ``feature``."""
        if self.views is None:
            raise CapabilityMissingError("OperatorViews", feature, self.store_type)
        return self.views

    def require_limit_control(self, feature: str) -> LimitControl:
        """The store as ``LimitControl``, or ``CapabilityMissingError`` for ``feature``."""
        if self.limit_control is None:
            raise CapabilityMissingError("LimitControl", feature, self.store_type)
        return self.limit_control

    def require_maintenance(self, feature: str) -> Maintenance:
        """The store as ``Maintenance``, or ``CapabilityMissingError`` for ``feature``."""
        if self.maintenance is None:
            raise CapabilityMissingError("Maintenance", feature, self.store_type)
        return self.maintenance

    def require_blockers(self, feature: str) -> ChainBlockers:
        """The store as ``ChainBlockers``, or ``CapabilityMissingError`` for ``feature``."""
        if self.blockers is None:
            raise CapabilityMissingError("ChainBlockers", feature, self.store_type)
        return self.blockers

    def require_debouncing(self, feature: str) -> Debouncing:
        """The store as ``Debouncing``, or ``CapabilityMissingError`` for ``feature``."""
        if self.debouncing is None:
            raise CapabilityMissingError("Debouncing", feature, self.store_type)
        return self.debouncing

    def require_signals(self, feature: str) -> ChainSignals:
        """The store as ``ChainSignals``, or ``CapabilityMissingError`` for ``feature``."""
        if self.signals is None:
            raise CapabilityMissingError("ChainSignals", feature, self.store_type)
        return self.signals
