"""Matching signal names on the worker's behalf: ``SignalMatcher``.

A name is to be matched (its pending signals paired with its waiting steps,
``ChainSignals.match_signals``) once a signal or a step waiting for it has committed:
after a staged hand-on of this worker into a waiting step, and on each ``signal``
notice the worker hears for a signal type its job types wait for. Both only leave the
name here (``want``) and go on; the matcher's own task matches what was left, several
names per match, and announces the queues of the steps it started, so a worker
starts each within milliseconds. The notices of one wake of the listener are all left
here before the task runs, so they make one match; and the store reads first which
names have anything to pair, so a notice with nothing left to pair (one side not
there yet, or another worker's match took it) costs one read, not a transaction.

Every worker that runs a type waiting for a signal's type hears its notice, so most
of them find the name *busy*: another worker's match is pairing it. Such a name is
not dropped, since that match may have begun before the commit this notice announces:
it is asked for again after a short backoff (doubling while the name stays busy), by
when the read usually finds nothing left to pair. A match that fails is tried again
after a backoff; one lost with the process is left to the maintenance's sweep.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import anyio

from pgwork.adapters.notify import NotifyAdapter
from pgwork.adapters.state import ChainSignals
from pgwork.worker._announce import announce_ready

log = logging.getLogger("pgwork.worker")

__all__ = ["MATCH_LIMIT", "SignalMatcher"]

# Pairs per name one match makes at most (a name with more is matched again at once),
# and names per match.
MATCH_LIMIT = 100
# Names kept waiting for a match at most; past it a name is dropped, for the sweep.
MAX_WANTED = 10_000
# A failed match is tried again after a backoff capped at this many seconds.
RETRY_MAX_S = 5.0
# A busy name (another match pairing it) is asked for again after this many seconds,
# twice that if it is busy again, and so on up to the cap. The first is about one
# match transaction's length: by then the other match has usually committed.
BUSY_RETRY_S = 0.02
BUSY_RETRY_MAX_S = 1.0


class SignalMatcher:
    """The one owner of the names this worker is to match, and the task matching them."""

    def __init__(self, *, store: ChainSignals, notify: NotifyAdapter) -> None:
        self._store = store
        self._notify = notify
        self._wanted: dict[str, None] = {}
        # Names found busy, asked for again at ``_busy_at`` (the event loop's clock);
        # ``_busy_rounds`` how many times running a retry found one busy again.
        self._busy: dict[str, None] = {}
        self._busy_at = 0.0
        self._busy_rounds = 0
        self._news = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        # Signals this worker delivered, matches it ran, and names it found busy (for
        # tests and stats).
        self.delivered = 0
        self.matches = 0
        self.busy = 0

    def want(self, names: Iterable[str]) -> None:
        """Have ``names`` matched soon (no I/O here)."""
        for name in names:
            if len(self._wanted) >= MAX_WANTED:
                log.warning("pgwork worker dropped a signal match (%d waiting)", MAX_WANTED)
                break
            self._wanted[name] = None
        if self._wanted:
            self._idle = anyio.Event() if self._idle.is_set() else self._idle
            self._news.set()

    async def run_forever(self) -> None:
        failures = 0
        while True:
            with anyio.move_on_after(self._until_retry()):
                await self._news.wait()
            self._news = anyio.Event()
            if self._busy and anyio.current_time() >= self._busy_at:
                # Asked again, as if wanted anew.
                self._wanted.update(self._busy)
                self._busy.clear()
            while self._wanted:
                # Taken before the match: a name wanted again meanwhile (a commit after
                # this match's snapshot) is matched once more.
                names = list(self._wanted)[:MATCH_LIMIT]
                for name in names:
                    del self._wanted[name]
                try:
                    await self._match(names)
                    failures = 0
                except Exception as exc:
                    self.want(names)
                    failures += 1
                    log.warning("pgwork could not match signals %s: %r", names[:3], exc)
                    await anyio.sleep(min(RETRY_MAX_S, 0.05 * 2**failures))
            if not self._busy:
                self._busy_rounds = 0
                self._idle.set()

    def _until_retry(self) -> float:
        """Seconds until the busy names are due again (infinite: none is busy)."""
        if not self._busy:
            return math.inf
        return max(0.0, self._busy_at - anyio.current_time())

    async def _match(self, names: list[str]) -> None:
        match = await self._store.match_signals(names=names, limit=MATCH_LIMIT)
        self.matches += 1
        for name in match.full:  # more pairs than one match makes
            self._wanted[name] = None
        if match.busy:
            self.busy += len(match.busy)
            if not self._busy:
                delay = BUSY_RETRY_S * 2**self._busy_rounds
                self._busy_at = anyio.current_time() + min(BUSY_RETRY_MAX_S, delay)
                self._busy_rounds += 1
            self._busy.update(dict.fromkeys(match.busy))
        if match.delivered:
            self.delivered += len(match.delivered)
            # A queue once per step: an adapter that hands out looks (Redis, NATS)
            # hands out one per step, not one per queue.
            await announce_ready(self._notify, [d.queue for d in match.delivered])

    async def flush(self) -> None:
        """Wait until every name left so far was matched (or the caller gives up): a
        busy name is matched once its retry found it free, or nothing left to pair."""
        await self._idle.wait()
