"""Holding notices until the caller's transaction has committed.

PostgreSQL's own notify adapter sends a notice inside the transaction, and the server
delivers it at commit. A broker (Redis, NATS) cannot see that transaction: a notice
published while it is open could wake a worker that looks before the commit, finds
nothing, and sleeps until its poll. So pgwork offers a block to wrap the transaction
in::

    async with notify_after_commit():
        async with conn.transaction():
            await client.start_chain(conn, SendMail, ...)
    # committed: the notices go out here

While the block is open, an adapter that cannot see commits holds every notice
published *with a transaction* (``hold``) instead of sending it, and the block sends
them as it exits cleanly, after the transaction inside it committed. When the block
raises, they are dropped: the transaction rolled back. A notice published without a
transaction goes at once, as always. Notices held by the block are sent even if the
code inside swallowed a rollback: a notice is a hint, and one too many costs an
empty acquire.

pgwork's own transactions (a worker's completions with continuations, its writes in
transactions of the store's own) open the block themselves; the adapters say in their
docs what they do with a notice published in a transaction outside any block.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Protocol

from pgwork.adapters.notify import Notice

__all__ = ["HeldNotices", "held_notices", "notify_after_commit"]

log = logging.getLogger("pgwork.notify")


class _Sender(Protocol):
    async def send_held(self, notices: Sequence[Notice]) -> None: ...


class HeldNotices:
    """The notices held for one ``notify_after_commit`` block, by adapter."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[_Sender, list[Notice]] = {}

    def hold(self, adapter: _Sender, notices: Sequence[Notice]) -> None:
        self._held.setdefault(adapter, []).extend(notices)

    def discard(self) -> None:
        self._held.clear()

    async def release(self) -> None:
        """Send what is held, each adapter's in one call. A failure is logged, not
        raised: the transaction committed, and the poll finds its jobs."""
        held, self._held = self._held, {}
        for adapter, notices in held.items():
            try:
                await adapter.send_held(notices)
            except Exception as exc:
                log.warning("pgwork could not send notices after the commit: %r", exc)


_current: ContextVar[HeldNotices | None] = ContextVar("pgwork_held_notices", default=None)


def held_notices() -> HeldNotices | None:
    """The innermost open ``notify_after_commit`` block's notices, if one is open."""
    return _current.get()


@asynccontextmanager
async def notify_after_commit(*, independent: bool = False) -> AsyncIterator[HeldNotices]:
    """Hold the notices published in a transaction inside the block until it exits;
    send them then, or drop them if it raises.

    A block inside another hands what it held to the outer one, whose transaction a
    nested one (a savepoint) commits with; ``independent``: the block wraps a
    transaction on a connection of its own, committed as the block exits, and sends
    its notices then whatever encloses it (pgwork's own transactions)."""
    outer = None if independent else _current.get()
    held = HeldNotices()
    token = _current.set(held)
    try:
        yield held
    except BaseException:
        held.discard()
        raise
    finally:
        _current.reset(token)
    if outer is not None:
        for adapter, notices in held._held.items():
            outer.hold(adapter, notices)
        held.discard()
        return
    await held.release()
