"""What the Redis and NATS adapters share: when a notice goes out, and the hints.

**When.** A broker cannot see the caller's PostgreSQL transaction. A notice published
with a transaction is held while a ``notify_after_commit`` block is open and sent as
the block exits, after the commit (pgwork's own transactions open one themselves).
Outside a block it goes at once, marked *early*: it may reach a worker before the
commit, whose acquire then finds nothing. So a listener that hands its worker an
early ``ready`` notice hands it the same notice once more ``recheck_after`` seconds
later (only to that worker, and for a hinted notice only if the worker claimed it): a
transaction that commits within that time costs an acquire more, not a poll's wait; one
open longer is left to the poll. A notice that cannot be sent (the broker is away) is
logged and dropped, never raised into the enqueue: the poll finds the job.

**Hints.** A ``ready`` notice that says how many jobs it announces (``count``) goes out
with a key of its own (the ``hint``) and nothing stored: the publisher's cost is the
message alone. Every listener hears it; a worker with room claims a look
(``BrokerListener.claim``) and only a winner acquires. A claim is one atomic operation
in the broker on keys named after the hint, which it creates (expiring after
``hint_ttl``): Redis counts the claims on one key and the first ``count`` win; NATS
creates one key-value key per look, and whoever creates look ``i`` first has it. A claim
that fails (the broker is away) counts as won: a hint may cost acquires, never a job.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

from pgwork.adapters.after_commit import held_notices
from pgwork.adapters.notify import Notice
from pgwork.errors import ConfigurationError
from pgwork.notify._wire import Message

__all__ = ["BrokerListener", "Publishing", "hinted", "positive"]

log = logging.getLogger("pgwork.notify")

# A failing publish is logged at most this often (seconds): an absent broker must not
# flood the log with one line per enqueue.
_FAILED_LOG_EVERY = 60.0
# Early hints a listener remembers (to repeat the ones its worker claims).
_EARLY_HINTS_KEPT = 4096


def positive(**values: float | None) -> None:
    """Refuse a setting that is not a positive number (None passes)."""
    for name, value in values.items():
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")


def hinted(notices: Sequence[Notice]) -> list[Notice]:
    """``notices`` with a fresh hint on each counted ``ready`` notice."""
    return [
        replace(n, hint=uuid.uuid4().hex)
        if n.kind == "ready" and n.count is not None and n.at is None
        else n
        for n in notices
    ]


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Publishing:
    """The publish side: held until commit, early, or at once; failures logged."""

    def __init__(self) -> None:
        self._failed = 0
        self._failed_logged_at = -math.inf

    async def publish(self, tx: object | None, *, notices: Sequence[Notice]) -> None:
        if not notices:
            return
        if not _in_event_loop():
            # A synchronous enqueue (``start_chain_sync``) drives this without an event
            # loop, where no broker can be reached: its jobs are found by the poll.
            self._note_failure("a synchronous enqueue has no event loop to publish on")
            return
        if tx is not None:
            held = held_notices()
            if held is not None:
                held.hold(self, notices)
                return
        await self._send_logged(notices, early=tx is not None)

    async def send_held(self, notices: Sequence[Notice]) -> None:
        """Send what a ``notify_after_commit`` block held (its transaction committed)."""
        await self._send_logged(notices, early=False)

    async def _send_logged(self, notices: Sequence[Notice], *, early: bool) -> None:
        try:
            await self._send(notices, early=early)
        except Exception as exc:
            self._note_failure(repr(exc))

    def _note_failure(self, why: str) -> None:
        """Count a batch of notices not sent; log the count at most once a minute."""
        self._failed += 1
        now = time.monotonic()
        if now - self._failed_logged_at >= _FAILED_LOG_EVERY:
            log.warning(
                "pgwork could not publish %d notice batch(es) (%s); workers find the "
                "jobs by their poll",
                self._failed,
                why,
            )
            self._failed = 0
            self._failed_logged_at = now

    async def _send(self, notices: Sequence[Notice], *, early: bool) -> None:
        raise NotImplementedError


class BrokerListener:
    """The listener side shared by the brokers: early notices repeated, claims made.

    A subclass receives messages, claims a look (``_take_look``), and reconnects as
    its broker requires."""

    def __init__(self, *, recheck_after: float) -> None:
        self._recheck_after = recheck_after
        self._rechecks: list[tuple[float, int, Notice]] = []  # (due, tiebreak, notice)
        self._tiebreak = 0
        self._early_hints: dict[str, None] = {}  # insertion-ordered: oldest first

    async def claim(self, notice: Notice) -> bool:
        """Take one of ``notice``'s looks (``ClaimsHints``); a won look at an early notice
        is repeated to this worker ``recheck_after`` seconds later."""
        if notice.hint is None or notice.count is None:
            return True
        won = await self._take_look(notice.hint, notice.count)
        if won and notice.hint in self._early_hints:
            del self._early_hints[notice.hint]
            self._repeat(replace(notice, hint=None, count=None))
        return won

    async def _take_look(self, hint: str, looks: int) -> bool:
        raise NotImplementedError

    def accept(self, message: Message) -> list[Notice]:
        """The notices of one message, the early ones noted for a repeat."""
        if message.early:
            for notice in message.notices:
                if notice.kind != "ready" or notice.at is not None:
                    continue
                if notice.hint is None:
                    self._repeat(notice)
                else:
                    self._early_hints[notice.hint] = None
                    while len(self._early_hints) > _EARLY_HINTS_KEPT:
                        del self._early_hints[next(iter(self._early_hints))]
        return message.notices

    def _repeat(self, notice: Notice) -> None:
        self._tiebreak += 1
        due = time.monotonic() + self._recheck_after
        bisect.insort(self._rechecks, (due, self._tiebreak, notice))

    def due_rechecks(self) -> list[Notice]:
        """The repeats whose time has come."""
        now = time.monotonic()
        cut = bisect.bisect_right(self._rechecks, (now, math.inf))
        due = [notice for _, _, notice in self._rechecks[:cut]]
        del self._rechecks[:cut]
        return due

    def until_next_recheck(self, timeout: float) -> float:
        """``timeout``, shortened to the next repeat's time."""
        if not self._rechecks:
            return timeout
        return max(0.0, min(timeout, self._rechecks[0][0] - time.monotonic()))
