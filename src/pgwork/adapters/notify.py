"""The wake-up contract: hints that work may be ready, or that an attempt must stop.

Notifications are hints, never the source of truth: they carry no payloads, a worker
still polls, and losing one costs latency, not correctness. An adapter must deliver a
notice published inside a transaction only after that transaction commits (and never
after a rollback) when it can; an adapter that cannot see commits says so in its docs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable
from uuid import UUID

__all__ = ["Listener", "Notice", "NotifyAdapter", "ready_notices"]

NoticeKind = Literal["ready", "abort", "chain_done", "signal", "reconnected"]


@dataclass(frozen=True, slots=True)
class Notice:
    """One hint.

    ``ready``: jobs may be ready in ``queue``; with ``at`` (seconds since the epoch),
    jobs there become due at that time (a scheduled job, a retry), which no later
    notice will announce: time has no notification, so a worker sets a timer.
    ``abort``: the attempt on ``job_id`` must stop (``reason`` is an AbortReason value).
    ``chain_done``: ``chain_id`` ended. ``signal``: a signal or a step waiting for one
    was committed under ``name`` (a signal's name): a worker matches the name.
    ``reconnected``: the listener lost notices while reconnecting; fetch now.
    """

    kind: NoticeKind
    queue: str | None = None
    job_id: UUID | None = None
    chain_id: UUID | None = None
    reason: str | None = None
    at: float | None = None
    name: str | None = None


class Listener(Protocol):
    """A live subscription. ``wait`` returns the notices that arrived, or [] on timeout."""

    async def wait(self, timeout: float) -> list[Notice]: ...


@runtime_checkable
class NotifyAdapter(Protocol):
    async def publish(self, tx: object | None, *, notices: Sequence[Notice]) -> None:
        """Publish ``notices``; with ``tx``, delivered when that transaction commits."""
        ...

    def listen(self) -> AbstractAsyncContextManager[Listener]:
        """Subscribe for as long as the context is open."""
        ...

    async def close(self) -> None: ...


def ready_notices(queues: Iterable[str], due: Iterable[tuple[str, float]] = ()) -> list[Notice]:
    """The ``ready`` notices that announce jobs ready now in ``queues`` and jobs that
    become due later, ``due`` being (queue, seconds since the epoch) pairs: time has no
    notification, so each due time is announced when the job is written, or never."""
    notices = [Notice(kind="ready", queue=q) for q in queues]
    notices += [Notice(kind="ready", queue=q, at=at) for q, at in due]
    return notices
