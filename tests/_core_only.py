"""A store that offers only the core of the contract: PostgreSQL seen through
``CoreStateAdapter``'s operations alone, and the capabilities it lacks.

The conformance tests run the shipped suite against it, and the engine tests run a
worker and a client on it: the real adapter underneath, nothing re-implemented.
"""

from __future__ import annotations

from pgwork import PostgresStateAdapter
from pgwork.adapters import state

__all__ = ["CAPABILITIES", "CORE_OPERATIONS", "CoreOnly", "operations"]

CAPABILITIES = (
    state.BatchedTurns,
    state.DueTimes,
    state.AtomicAttempts,
    state.AtomicGroupCommit,
    state.InLineRenewal,
    state.ChainBlockers,
    state.OperatorViews,
    state.Maintenance,
)


def operations(protocol: type) -> set[str]:
    """The operations ``protocol`` declares, its bases' included."""
    return {
        name
        for klass in protocol.__mro__
        if klass is not object
        for name, value in vars(klass).items()
        if not name.startswith("_") and callable(value)
    }


CORE_OPERATIONS = sorted(operations(state.CoreStateAdapter))


class CoreOnly:
    """``inner``'s core operations, and nothing else."""

    def __init__(self, inner: PostgresStateAdapter) -> None:
        for name in CORE_OPERATIONS:
            setattr(self, name, getattr(inner, name))
