"""Sending signals: ``client.signal`` and its blocking twin ``signal_sync``.

A signal is written in the caller's own transaction, with the same connection kinds as
``start_chain``, and announced (a ``signal`` notice) when that transaction commits; a
worker then hands it to the oldest step waiting for its name (docs/chains.md, "Waiting
for a signal"). Both calls drive one coroutine, ``_signal``: validate and encode
before any statement, adopt ``tx``, write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar
from uuid import UUID

from pgwork._ids import new_id
from pgwork.adapters.state import NewSignal, TransactionHandle
from pgwork.client._sync import _drive
from pgwork.signals import SignalKey, SignalType

if TYPE_CHECKING:
    from pgwork.adapters.capabilities import Capabilities
    from pgwork.adapters.notify import NotifyAdapter
    from pgwork.adapters.state import CoreStateAdapter
    from pgwork.job_types import JobTypeRegistry

__all__ = ["SignalMixin"]

P = TypeVar("P")


class SignalMixin:
    """Mixed into ``Client``: send signals to the steps that wait for them."""

    if TYPE_CHECKING:
        state: CoreStateAdapter
        capabilities: Capabilities
        notify: NotifyAdapter
        registry: JobTypeRegistry
        max_payload_bytes: int

        def _sync_adopt(self) -> Callable[[object], Awaitable[TransactionHandle]]: ...

    async def signal(
        self, tx: object, signal_type: SignalType[P], key: SignalKey | None, payload: P
    ) -> UUID:
        """Send a signal of ``signal_type`` named by ``key`` with ``payload``, in the
        caller's open transaction ``tx`` (the same kinds as ``start_chain``'s); returns
        its id.

        It exists once, and only if, the caller commits; then the oldest step waiting
        for its name (``"{type}:{key}"``, the type's name alone for ``key=None``)
        starts with it, within milliseconds. A signal that finds no step waiting is
        kept (a worker's ``signal_retention``, seven days by default) for the next step
        that waits for its name; a name nothing waits for is not an error. Signals to
        one name queue: each goes to one step, oldest signal to oldest step. Safe at
        any isolation level: the write reads nothing. The key and the payload are
        checked before any statement (``InvalidOptionError``, ``PayloadError``)."""
        return await self._signal(signal_type, key, payload, self.state.adopt, tx)

    def signal_sync(
        self, conn: object, signal_type: SignalType[P], key: SignalKey | None, payload: P
    ) -> UUID:
        """``signal`` on a blocking connection (the same kinds as ``start_chain_sync``'s);
        starts no event loop."""
        return _drive(self._signal(signal_type, key, payload, self._sync_adopt(), conn))

    async def _signal(
        self,
        signal_type: SignalType[P],
        key: SignalKey | None,
        payload: P,
        adopt: Callable[[object], Awaitable[TransactionHandle]],
        tx: object,
    ) -> UUID:
        self.registry.resolve_signal(signal_type)
        name = signal_type.signal_name(key)
        payload_json = signal_type.payload_codec.encode(payload, max_bytes=self.max_payload_bytes)
        signals = self.capabilities.require_signals("client.signal")
        sent = NewSignal(id=new_id(), name=name, payload_json=payload_json)
        handle = await adopt(tx)
        await signals.send_signals(handle, signals=[sent], notify=self.notify)
        return sent.id
