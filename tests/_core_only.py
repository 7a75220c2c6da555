"""A store that offers only the core of the contract: PostgreSQL seen through
``CoreStateAdapter``'s operations alone.

The conformance tests run the shipped suite against it, and the engine tests run a
worker and a client on it: the real adapter underneath, nothing re-implemented.
"""

from __future__ import annotations

from pgwork import PostgresStateAdapter
from pgwork.adapters import state
from pgwork.adapters.capabilities import operations

__all__ = ["CORE_OPERATIONS", "CoreOnly"]

CORE_OPERATIONS = sorted(operations(state.CoreStateAdapter))


class CoreOnly:
    """``inner``'s core operations, and nothing else."""

    def __init__(self, inner: PostgresStateAdapter) -> None:
        for name in CORE_OPERATIONS:
            setattr(self, name, getattr(inner, name))
