"""When the worker looks for jobs: only when something says there may be some.

An acquire that comes back with fewer jobs than it asked for has seen every queue the
worker serves empty of jobs due now. Asking again at once would find the same: an idle
worker that re-acquired whenever an acquire came back spun ~550 transactions a second
on an empty queue. So after such an acquire the worker waits for one of:

* a hint that work may be ready: a ``ready`` notification for one of its queues, the
  listener reconnecting (it may have missed some), dead workers' jobs taken back, a
  job reaped;
* a job becoming due: time has no notification, so the worker keeps timers for the
  due times it learns (``ready`` notices with ``at``, its own retries, and the
  database's answer to ``next_due``, asked at start and whenever a timer fired but the
  acquire it caused found nothing; it counts the jobs that became due since that
  acquire was sent as due now, for a timer that fired early made it find nothing);
* the poll interval since that acquire: the safety net for lost notifications.

Every hint bumps ``generation``; an acquire remembers the generation it was sent in,
and only a short acquire sent after the latest hint marks the queues drained. A hint
that arrives while an acquire is in flight therefore always gets an acquire of its own:
the job it announces may have committed after the in-flight acquire's snapshot.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable

__all__ = ["MAX_TIMERS", "Wakeups"]

# Due times remembered at once (the earliest of them); beyond them the poll interval and
# ``next_due`` (asked whenever a timer fires and finds nothing) catch up.
MAX_TIMERS = 1024

# ``missed_after``'s allowance for two statements' round trips differing (seconds).
ROUND_TRIP_MARGIN_S = 1.0


class Wakeups:
    """Demand bookkeeping for one worker; all times are ``clock()`` seconds."""

    __slots__ = (
        "_clock",
        "_drained_as_of",
        "_drained_sent_at",
        "_poll_at",
        "_timers",
        "found_nothing",
        "generation",
        "look_ahead",
    )

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.generation = 1
        self._drained_as_of = 0
        self._drained_sent_at = self._clock()
        self._poll_at = math.inf
        self._timers: list[float] = []  # sorted, earliest first
        # Ask the database when the next job becomes due: at start, and after a timer
        # fired whose acquire found nothing (a job cancelled, taken, or a clock skew).
        self.look_ahead = True
        # The last acquire came back short (a poll's hint does not change that).
        self.found_nothing = False

    @property
    def may_have_work(self) -> bool:
        """False from a short acquire until the next hint, timer or poll."""
        return self._drained_as_of < self.generation

    def hint(self) -> None:
        """Something says jobs may be ready now."""
        self.generation += 1

    def due_in(self, seconds: float) -> None:
        """A job becomes due in ``seconds`` (now or in the past: a hint).

        A due time that is no number (NaN, infinite) is ignored: it would never fire
        and, NaN comparing false with everything, would disorder the timers. When
        they are full, the latest gives way to an earlier one, so a flood of far due
        times cannot crowd out the next one."""
        if not math.isfinite(seconds):
            return
        if seconds <= 0:
            self.hint()
            return
        timers = self._timers
        at = self._clock() + seconds
        if len(timers) >= MAX_TIMERS:
            if at >= timers[-1]:
                return
            timers.pop()
        bisect.insort(timers, at)

    def due_at(self, epoch: float) -> None:
        """A job becomes due at ``epoch`` (seconds since the epoch, wall clock)."""
        self.due_in(epoch - time.time())

    def acquired(
        self, generation: int, *, sent_at: float, asked: int, got: int, poll_interval: float
    ) -> None:
        """An acquire sent at ``sent_at`` in ``generation`` asked for ``asked`` jobs and
        got ``got``."""
        self.found_nothing = got < asked
        if got < asked and generation > self._drained_as_of:
            self._drained_as_of = generation
            self._drained_sent_at = sent_at
            self._poll_at = self._clock() + poll_interval

    def missed_after(self) -> float:
        """A little before the acquire that found the queues drained was sent: a job
        that became due since may have been not due yet to it (``next_due``'s
        ``missed_after``). The margin covers that acquire's statement having reached
        the server sooner after being sent than ``next_due``'s does."""
        return self._drained_sent_at - ROUND_TRIP_MARGIN_S

    def deadline(self) -> float:
        """When ``tick`` next has something to do (the earliest timer or the poll)."""
        poll = math.inf if self.may_have_work else self._poll_at
        return min(poll, self._timers[0]) if self._timers else poll

    def tick(self) -> None:
        """Fire the timers that are due, and the poll when it is."""
        now = self._clock()
        fired = bisect.bisect_right(self._timers, now)
        if fired:
            del self._timers[:fired]
            self.look_ahead = True
            self.hint()
        elif not self.may_have_work and now >= self._poll_at:
            self.hint()
