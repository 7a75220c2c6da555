"""The client: enqueue chains in the caller's transaction, read and steer them.

This module only re-exports. ``Client`` (``_client.py``: enqueue and the reads of one
job or chain) is assembled from one mixin per concern: listings and counts
(``_queries.py``), control (``_control.py``: await, cancel, retry, complete from
outside, trigger, pause, delete), work views (``_work.py``), the operator's read side
(``_insight.py``), the job history (``_history.py``), flow limits at run time
(``_limits.py``), signals to waiting steps (``_signals.py``) and the enqueue without
an event loop (``_sync.py``). ``ChainStart``
and ``StartedChain`` are in ``_starts.py``.
"""

from pgwork.client._client import Client, create_client
from pgwork.client._limits import limits_metadata
from pgwork.client._starts import ChainStart, StartedChain

__all__ = ["ChainStart", "Client", "StartedChain", "create_client", "limits_metadata"]
