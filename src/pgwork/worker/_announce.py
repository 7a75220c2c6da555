"""Telling workers about jobs that no other notification announces.

A job handed back by a stopping worker, taken back from a dead one, retried after a
backoff or rescheduled by its handler becomes ready (now, or at a due time) without an
enqueue, a completion or a resolved blocker that would announce it. An idle worker
acquires only on a hint (see ``_wakeups``), so these are announced here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pgwork.adapters.notify import Notice, NotifyAdapter

log = logging.getLogger("pgwork.worker")

__all__ = ["announce_ready"]


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
    notices = [Notice(kind="ready", queue=q, at=at) for q in dict.fromkeys(queues)]
    try:
        await notify.publish(tx, notices=notices)
    except Exception as exc:
        log.warning("pgwork could not announce ready jobs: %r", exc)
