"""Grouping staged completions that finish close together into one statement.

A slot hands its completion to the batcher and waits; the batcher writes everything
that arrived within ``max_delay`` (or as soon as ``max_size`` are waiting) with one
``complete`` call, then releases each waiting slot with its own result. A slot is
released only after the write committed, so nothing is acknowledged before it is
durable. Completions with a continuation, or inside an atomic attempt's transaction,
do not come here: they need their own transaction.

A failed write is retried with a short backoff (the jobs are still leased to us); if
it keeps failing, every waiting slot gets the error and its job is left to be reaped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from pgwork.adapters.state import Completion, CompletionResult, StateAdapter

log = logging.getLogger("pgwork.worker")

__all__ = ["CompletionBatcher"]

RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0, 2.0)


@dataclass(slots=True)
class _Pending:
    completion: Completion
    done: anyio.Event = field(default_factory=anyio.Event)
    result: CompletionResult | None = None
    error: BaseException | None = None


class CompletionBatcher:
    """``in_flight()`` is the number of attempts that may still join a batch: once all
    of them are waiting here, waiting longer only adds latency, so the batch goes."""

    def __init__(
        self,
        state: StateAdapter,
        *,
        in_flight: Callable[[], int],
        max_size: int = 200,
        max_delay: float = 0.002,
    ):
        self.state = state
        self.max_size = max_size
        self.max_delay = max_delay
        self._in_flight = in_flight
        self._waiting: list[_Pending] = []
        self._arrived = anyio.Event()
        self._full = anyio.Event()

    async def complete(self, completion: Completion) -> CompletionResult:
        """Queue ``completion`` and return its result once it is committed."""
        pending = _Pending(completion)
        self._waiting.append(pending)
        self._arrived.set()
        if len(self._waiting) >= min(self.max_size, self._in_flight()):
            self._full.set()
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    async def run_forever(self) -> None:
        """Flush batches until cancelled; a batch being written is shielded so slots
        are never left waiting for a write that was cut off."""
        while True:
            await self._arrived.wait()
            with anyio.move_on_after(self.max_delay):
                await self._full.wait()
            batch, self._waiting = self._waiting, []
            self._arrived = anyio.Event()
            self._full = anyio.Event()
            with anyio.CancelScope(shield=True):
                await self._flush(batch)

    async def _flush(self, batch: list[_Pending]) -> None:
        if not batch:
            return
        error: BaseException | None = None
        for delay in (*RETRY_DELAYS, None):
            try:
                results = await self.state.complete(None, completions=[p.completion for p in batch])
            except Exception as exc:
                error = exc
                if delay is None:
                    break
                log.warning(
                    "pgwork could not write %d completion(s) (%r); retrying in %.2fs",
                    len(batch),
                    exc,
                    delay,
                )
                await anyio.sleep(delay)
                continue
            for pending, result in zip(batch, results, strict=True):
                pending.result = result
                pending.done.set()
            return
        for pending in batch:
            pending.error = error
            pending.done.set()
