"""What waits: a chain's waiting step, the listing of waiting steps, the signals.

Mixed into ``Client``. Each read is one statement over the partial indexes the waiting
rows are in (``OperatorViews``: ``chain_waits``, ``list_waiting``, ``list_signals``);
what counts as waiting, and for what, is written once, in the store's SQL, from the
rows alone (docs/chains.md, "Seeing what waits"). Listings are newest first, paged like
``list_jobs``: a page's ``next_cursor`` continues strictly after its last row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from pgwork.adapters.state import PageKey, SignalFilter, WaitingFilter
from pgwork.client._queries import _fetch_size, _page, decode_cursor
from pgwork.errors import ConfigurationError
from pgwork.records import Page, SignalRecord, Waiting, WaitKind

if TYPE_CHECKING:
    from pgwork.adapters.capabilities import Capabilities
    from pgwork.adapters.state import TransactionHandle

__all__ = ["WaitingMixin"]

_WAITING = "wait"
_SIGNALS = "sig"


class WaitingMixin:
    """``waiting``, ``list_waiting`` and ``list_signals`` of ``Client``."""

    if TYPE_CHECKING:
        capabilities: Capabilities

        async def _read_handle(self, tx: object | None) -> TransactionHandle | None: ...

    async def waiting(self, chain_id: UUID, *, tx: object | None = None) -> Waiting | None:
        """What the chain's current step (its newest job) waits for: a signal, a time,
        a debounce, blocker chains; ``None`` when it waits for nothing a worker does
        not do (it is ready, running, retrying, or the chain ended or does not exist).
        """
        views = self.capabilities.require_views("Client.waiting")
        found = await views.chain_waits(await self._read_handle(tx), chain_ids=[chain_id])
        return found[0] if found else None

    async def list_waiting(
        self,
        *,
        kind: WaitKind | str | None = None,
        chain_type: str | None = None,
        signal: str | None = None,
        signal_prefix: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tx: object | None = None,
    ) -> Page[Waiting]:
        """One page of waiting steps, newest first, each with what it waits for.

        ``kind``: one kind of wait (``WaitKind``: ``signal``, ``sleep``, ``debounce``,
        ``blockers``); ``chain_type``: steps of chains of that type; ``signal``: steps
        waiting for that signal name, ``signal_prefix`` for a name starting with it
        (``"payment:"``: every payment). Reads the index entries of the waiting steps
        of the kinds asked for, never a ready or an ended job. Pass ``next_cursor`` back
        with the same filters for the next page.
        """
        chosen = _wait_kind(kind)
        if signal is not None and signal_prefix is not None:
            raise ConfigurationError("give signal or signal_prefix, not both")
        if (signal is not None or signal_prefix is not None) and chosen not in (
            None,
            WaitKind.SIGNAL,
        ):
            raise ConfigurationError(
                f"a signal filter lists signal waits only; drop kind={chosen.value!r}"
            )
        where = WaitingFilter(
            kinds=(chosen,) if chosen is not None else (),
            signal=signal,
            signal_prefix=signal_prefix,
            chain_type=chain_type,
        )
        size, after = _fetch_size(limit), decode_cursor(cursor, _WAITING)
        views = self.capabilities.require_views("Client.list_waiting")
        found = await views.list_waiting(
            await self._read_handle(tx), where=where, after=after, limit=size
        )
        return _page(found, limit, _WAITING, lambda w: PageKey(w.since, w.job_id))

    async def list_signals(
        self,
        *,
        pending: bool = True,
        name: str | None = None,
        name_prefix: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tx: object | None = None,
    ) -> Page[SignalRecord]:
        """One page of signals, newest first: ``pending`` ones (sent, and taken by no
        step yet: kept for the next step that waits for their name), or every signal
        kept (``pending=False``: consumed ones too, until the workers' retention
        deletes them). ``name`` / ``name_prefix`` filter by name. Payloads are the
        stored JSON. Same paging as ``list_waiting``."""
        if name is not None and name_prefix is not None:
            raise ConfigurationError("give name or name_prefix, not both")
        where = SignalFilter(pending=bool(pending), name=name, name_prefix=name_prefix)
        size, after = _fetch_size(limit), decode_cursor(cursor, _SIGNALS)
        views = self.capabilities.require_views("Client.list_signals")
        found = await views.list_signals(
            await self._read_handle(tx), where=where, after=after, limit=size
        )
        return _page(found, limit, _SIGNALS, lambda s: PageKey(s.sent_at, s.id))


def _wait_kind(kind: WaitKind | str | None) -> WaitKind | None:
    if kind is None:
        return None
    try:
        return WaitKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in WaitKind)
        raise ConfigurationError(f"unknown kind of wait {kind!r}; one of {known}") from None
