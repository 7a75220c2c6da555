"""PostgreSQL side of the read API: listings, counts, deletion and retention.

Mixed into ``PostgresStateAdapter``; uses its ``pool``, ``schema``, ``_fetch`` and
``_connection``.
"""

from __future__ import annotations

__all__ = ["QueryOps"]


class QueryOps:
    """Listing / counting / deleting operations of the PostgreSQL state adapter."""
