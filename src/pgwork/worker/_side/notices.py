"""What the worker does with each notice its listener hears.

``ready`` for one of its queues is a hint (acquire now) or, with ``at``, a due time to
set a timer for; ``reconnected`` is a hint too (notices may have been lost meanwhile);
``abort`` stops the attempt on that job if this worker runs it. A notice this version
cannot act on (an abort reason it does not know, a due time that is no time) is logged
and ignored: a notice is a hint, and no hint may stop the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio

from pgwork.adapters.notify import Listener, Notice
from pgwork.observability import LISTENER_RECONNECTED
from pgwork.observability.emitter import Emitter
from pgwork.records import AbortReason
from pgwork.worker._wakeups import Wakeups

log = logging.getLogger("pgwork.worker")

__all__ = ["NoticeRouter"]

# A failing listener retries after a backoff capped at this many seconds.
LISTEN_BACKOFF_MAX = 5.0


class NoticeRouter:
    def __init__(
        self,
        *,
        worker_id: str,
        queues: Sequence[str],
        wakeups: Wakeups,
        wake: Callable[[], None],
        abort_job: Callable[..., None],
        events: Emitter,
    ) -> None:
        self.worker_id = worker_id
        self.queues = frozenset(queues)
        self._wakeups = wakeups
        self._wake = wake
        self._abort_job = abort_job
        self._events = events

    async def listen_forever(self, listener: Listener, *, timeout: float) -> None:
        failures = 0
        while True:
            try:
                notices = await listener.wait(timeout)
                failures = 0
            except Exception as exc:
                failures += 1
                log.warning("pgwork listener failed (%r)", exc)
                await anyio.sleep(min(LISTEN_BACKOFF_MAX, 0.1 * 2**failures))
                continue
            for notice in notices:
                self.route(notice)

    def route(self, notice: Notice) -> None:
        if notice.kind == "ready" and (notice.queue is None or notice.queue in self.queues):
            if notice.at is None:
                self._wakeups.hint()
            else:
                self._wakeups.due_at(notice.at)
            self._wake()  # to acquire, or to wait for the new timer, not the old deadline
        elif notice.kind == "reconnected":
            self._wakeups.hint()
            self._wake()
            self._events.emit(LISTENER_RECONNECTED, worker_id=self.worker_id)
        elif notice.kind == "abort" and notice.job_id is not None:
            try:
                reason = AbortReason(notice.reason or AbortReason.OWNERSHIP_LOST)
            except ValueError:
                log.warning("pgwork worker %s ignored a notice: %r", self.worker_id, notice)
                return
            self._abort_job(notice.job_id, reason)
