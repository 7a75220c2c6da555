"""Client API of the operator's read side: recent activity and a chain's links.

Mixed into ``Client``; what the dashboard reads besides the listings of
``_queries.py``. Both read bounded index ranges, so they cost the same on any size
of table.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING
from uuid import UUID

from pgwork.adapters.insight import ChainLinks, RecentActivity
from pgwork.errors import ConfigurationError

if TYPE_CHECKING:
    from pgwork.adapters.capabilities import Capabilities
    from pgwork.adapters.state import TransactionHandle

__all__ = ["InsightMixin"]

DEFAULT_SAMPLE = 100_000
MAX_LINKS = 1000


class InsightMixin:
    """``recent_activity`` and ``chain_links`` of ``Client``."""

    if TYPE_CHECKING:
        capabilities: Capabilities

        async def _read_handle(self, tx: object | None) -> TransactionHandle | None: ...

    async def recent_activity(
        self,
        *,
        window: timedelta = timedelta(hours=1),
        bucket: timedelta = timedelta(minutes=2),
        sample_size: int = DEFAULT_SAMPLE,
        tx: object | None = None,
    ) -> RecentActivity:
        """Jobs that completed or failed within ``window``, per queue and ``bucket``.

        Counts are exact up to ``sample_size`` ended jobs in the window, read newest
        first from an index of ended jobs, so the cost stays bounded however busy the
        hour was; past that, ``complete`` on the result is false and ``counted_from``
        says how far back the count reached.
        """
        if window <= timedelta(0) or bucket <= timedelta(0) or bucket > window:
            raise ConfigurationError(
                f"window and bucket must be positive and bucket <= window, got "
                f"window={window}, bucket={bucket}"
            )
        if not 1 <= sample_size <= 1_000_000:
            raise ConfigurationError(f"sample_size must be in 1..1000000, got {sample_size}")
        return await self.capabilities.require_views("Client.recent_activity").recent_activity(
            await self._read_handle(tx), window=window, bucket=bucket, sample_size=sample_size
        )

    async def chain_links(
        self, chain_id: UUID, *, limit: int = 100, tx: object | None = None
    ) -> ChainLinks:
        """The chains ``chain_id``'s jobs wait for and the jobs of other chains that wait
        for it (up to ``limit`` of each), with the status at the other end of each edge."""
        if not 1 <= limit <= MAX_LINKS:
            raise ConfigurationError(f"limit must be between 1 and {MAX_LINKS}, got {limit}")
        return await self.capabilities.require_views("Client.chain_links").chain_links(
            await self._read_handle(tx), chain_id=chain_id, limit=limit
        )
