"""The wake-up contract: hints that work may be ready, or that an attempt must stop.

Notifications are hints, never the source of truth: they carry no payloads, a worker
still polls, and losing one costs latency, not correctness. An adapter must deliver a
notice published inside a transaction only after that transaction commits (and never
after a rollback) when it can; an adapter that cannot see commits says so in its docs,
and holds such notices while a ``notify_after_commit`` block is open
(``pgwork.adapters.after_commit``).

A ``ready`` notice may say how many jobs it announces (``count``). An adapter that
hands out hints (Redis, NATS) turns that count into as many *looks*: every listener
hears the notice, marked with a ``hint``, and a worker with room claims a look
(``ClaimsHints.claim``) before it acquires, so that one job costs one worker's acquire,
not every idle worker's. A claim that fails lets its claimant look: a hint may
cost an extra acquire, never a job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable
from uuid import UUID

__all__ = ["ClaimsHints", "Listener", "Notice", "NotifyAdapter", "counted_ready", "ready_notices"]

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

    ``count`` (``ready`` without ``at``): how many jobs became ready, when the publisher
    knows (None: some). An adapter that carries no count delivers None. ``hint``: set
    on a delivered notice by an adapter that hands out hints, naming the notice's
    looks a worker claims from (``ClaimsHints``); None on everything published.
    """

    kind: NoticeKind
    queue: str | None = None
    job_id: UUID | None = None
    chain_id: UUID | None = None
    reason: str | None = None
    at: float | None = None
    name: str | None = None
    count: int | None = None
    hint: str | None = None


class Listener(Protocol):
    """A live subscription. ``wait`` returns the notices that arrived, or [] on timeout."""

    async def wait(self, timeout: float) -> list[Notice]: ...


@runtime_checkable
class ClaimsHints(Protocol):
    """An optional role of a ``Listener`` whose adapter hands out hints.

    ``claim`` takes one of the looks of a notice it delivered with a ``hint``:
    True when the worker should acquire (a look was left, or the claim could not be
    made, and looking is safer than missing a job), False when other workers took
    every look. A worker claims only when it has room to run a job:
    one that is full acquires anyway as its slots free up, and a look it took would
    leave an idle worker asleep.
    """

    async def claim(self, notice: Notice) -> bool: ...


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


def counted_ready(queues: Iterable[str]) -> list[Notice]:
    """One ``ready`` notice per distinct queue of ``queues`` (one entry per job made
    ready), counting the jobs, in the order the queues first appear."""
    return [Notice(kind="ready", queue=q, count=n) for q, n in Counter(queues).items()]
