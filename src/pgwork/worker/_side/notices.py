"""What the worker does with each notice its listener hears.

``ready`` for one of its queues is a hint (acquire now) or, with ``at``, a due time to
set a timer for; ``reconnected`` is a hint too (notices may have been lost meanwhile):
the router tells ``Wakeups`` and rings the loop's bell itself. A ``ready`` notice that
carries a ``hint`` (an adapter that hands out hints: Redis, NATS) is handed back as a
``Claim`` instead: only the loop knows whether the worker has room, and only a worker
with room claims a look before it acquires (``act_on_claim``). ``abort`` stops the
attempt on that job if this worker runs it: the router hands it back as an ``Abort``
(``actions`` yields them), and the worker's slots act on it. ``signal`` for a signal
type one of the worker's job types waits for is handed back as a ``MatchSignal``, for
the worker's ``SignalMatcher``. A notice this version cannot act on (an abort reason it
does not know, a due time that is no time) is logged and ignored: a notice is a hint,
and no hint may stop the worker.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import NamedTuple
from uuid import UUID

import anyio

from pgwork._limits import storable_text
from pgwork.adapters.notify import ClaimsHints, Listener, Notice
from pgwork.observability import LISTENER_RECONNECTED
from pgwork.observability.emitter import Emitter
from pgwork.records import AbortReason
from pgwork.worker._bell import Bell
from pgwork.worker._wakeups import Wakeups

log = logging.getLogger("pgwork.worker")

__all__ = ["Abort", "Claim", "MatchSignal", "NoticeRouter"]

# A failing listener retries after a backoff capped at this many seconds.
LISTEN_BACKOFF_MAX = 5.0


class Abort(NamedTuple):
    """An ``abort`` notice for a job: stop the attempt on it, if this worker runs one."""

    job_id: UUID
    reason: AbortReason


class Claim(NamedTuple):
    """A hinted ``ready`` notice for one of the worker's queues: a worker with room
    claims one of its looks before it acquires."""

    notice: Notice


class MatchSignal(NamedTuple):
    """A ``signal`` notice: a signal, or a step waiting for one, was committed under
    ``name``; match it."""

    name: str


class NoticeRouter:
    def __init__(
        self,
        *,
        worker_id: str,
        queues: Sequence[str],
        wakeups: Wakeups,
        bell: Bell,
        events: Emitter,
        signal_types: Iterable[str] = (),
    ) -> None:
        self.worker_id = worker_id
        self.queues = frozenset(queues)
        # The signal types its job types wait for: it matches their names only.
        self.signal_types = frozenset(signal_types)
        self._wakeups = wakeups
        self._bell = bell
        self._events = events

    async def actions(
        self, listener: Listener, *, timeout: float
    ) -> AsyncIterator[Abort | Claim | MatchSignal]:
        """Listen until cancelled, acting on each notice heard; yield the aborts, which
        only the worker's slots can act on, and the names to match."""
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
                action = self.route(notice)
                if action is not None:
                    yield action

    def route(self, notice: Notice) -> Abort | Claim | MatchSignal | None:
        """Act on ``notice``; an abort is returned for the slots to act on, a name to
        match for the signal matcher, a hinted ``ready`` notice for the loop to claim."""
        if notice.kind == "ready" and (notice.queue is None or notice.queue in self.queues):
            if notice.hint is not None and notice.at is None:
                return Claim(notice)
            if notice.at is None:
                self._wakeups.hint()
            else:
                self._wakeups.due_at(notice.at)
            self._bell.ring()  # to acquire, or to wait for the new timer, not the old deadline
        elif notice.kind == "reconnected":
            self._wakeups.hint()
            self._bell.ring()
            self._events.emit(LISTENER_RECONNECTED, worker_id=self.worker_id)
        elif notice.kind == "abort" and notice.job_id is not None:
            try:
                reason = AbortReason(notice.reason or AbortReason.OWNERSHIP_LOST)
            except ValueError:
                log.warning("pgwork worker %s ignored a notice: %r", self.worker_id, notice)
                return None
            return Abort(notice.job_id, reason)
        elif (
            notice.kind == "signal"
            and isinstance(notice.name, str)  # an in-process notice is not decoded
            and notice.name.split(":", 1)[0] in self.signal_types
            # A name no statement can carry (a broker's JSON may hold a NUL or a lone
            # surrogate) names no signal, and would fail every match asked for with it.
            and storable_text(notice.name)
        ):
            return MatchSignal(notice.name)
        return None


async def act_on_claim(
    listener: Listener, claim: Claim, *, has_room: bool, wakeups: Wakeups, bell: Bell
) -> bool:
    """Act on a hinted ``ready`` notice; return whether the worker will look.

    With room, the worker looks only if it wins one of the notice's looks (a listener
    that cannot claim, or a claim that fails, counts as won: a hint may cost an acquire,
    never a job). Without room it looks as its slots free up, as for any ready notice,
    and takes none of the notice's looks: an idle worker takes that one."""
    if has_room and isinstance(listener, ClaimsHints):
        try:
            won = await listener.claim(claim.notice)
        except Exception as exc:
            log.warning("pgwork could not claim a hint (%r); looking anyway", exc)
            won = True
        if not won:
            return False
    wakeups.hint()
    bell.ring()
    return True
