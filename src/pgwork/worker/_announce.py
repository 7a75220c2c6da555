"""Telling workers about jobs that no other notification announces.

A job handed back by a stopping worker, taken back from a dead one, retried after a
backoff or rescheduled by its handler becomes ready (now, or at a due time) without an
enqueue, a completion or a resolved blocker that would announce it. An idle worker
acquires only on a hint (see ``_wakeups``), so these are announced here.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from pgwork.adapters.notify import Notice, NotifyAdapter

log = logging.getLogger("pgwork.worker")

__all__ = ["announce_ready", "due_epoch"]


async def announce_ready(
    notify: NotifyAdapter | None,
    queues: Iterable[str | None],
    *,
    at: float | None = None,
    tx: object | None = None,
) -> None:
    """Publish a ``ready`` notice per queue (``None``: any queue), due at ``at``
    (seconds since the epoch) when given. A hint: failing to send one is logged, and
    the poll interval covers for it."""
    if notify is None:
        return
    # A queue named once per job, so that a broker hands out that many looks; None
    # (any queue) or a due time: every worker hears it.
    counts = Counter(queues)
    notices = [
        Notice(kind="ready", queue=q, at=at, count=n if q is not None and at is None else None)
        for q, n in counts.items()
    ]
    try:
        await notify.publish(tx, notices=notices)
    except Exception as exc:
        log.warning("pgwork could not announce ready jobs: %r", exc)


def due_epoch(run_at: datetime | None, run_after: timedelta | None) -> float:
    """When a rescheduled job becomes due: the later of ``run_at`` and ``run_after``
    from now (as the state adapter schedules it), in seconds since the epoch."""
    due = time.time() + (run_after.total_seconds() if run_after is not None else 0.0)
    if run_at is not None:
        if run_at.tzinfo is None:
            run_at = run_at.replace(tzinfo=UTC)
        due = max(due, run_at.timestamp())
    return due
