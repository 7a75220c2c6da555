"""Read-side client API: listings with keyset pagination, counts, deletion, retention.

Mixed into ``Client``; relies on ``self.state`` (a StateAdapter) and ``self._decoded``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgwork.adapters.state import StateAdapter
    from pgwork.job_types import JobTypeRegistry

__all__ = ["QueryMixin"]


class QueryMixin:
    """Listings, counts and deletion, filled in by the query feature."""

    if TYPE_CHECKING:
        state: StateAdapter
        registry: JobTypeRegistry
