"""PostgreSQL side of completing attempts (part of the ``WorkerStore`` role).

``complete`` (a batch, or one job handed on to its continuation in one statement),
``complete_atomic`` (the completion and the COMMIT of an atomic attempt in one round
trip) and what both share: inserting continuations and settling the dependants of
chains that ended. Mixed into ``PostgresStateAdapter`` (``state.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from pgwork._frozen import frozen_builder
from pgwork.adapters._state_records import earliest_due
from pgwork.adapters.notify import Notice, NotifyAdapter, counted_ready, ready_notices
from pgwork.adapters.state import (
    Completion,
    CompletionResult,
    TransactionHandle,
)
from pgwork.postgres._enqueue import due_notices
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._pool import bounded
from pgwork.postgres._state_enqueue import EnqueueOps, scheduled
from pgwork.postgres._storable import storable
from pgwork.postgres._transactions import PgTransaction, own_connection, read_committed
from pgwork.postgres.notify import PostgresNotifyAdapter, encode_notice
from pgwork.postgres.sql.outcomes import ATOMIC_REFUSED

__all__ = [
    "CompletionOps",
    "atomic_completion_params",
    "completion_params",
    "mark_deferred",
]

_INERROR = TransactionStatus.INERROR

# One result per completed job, a batch of them per worker turn (``_frozen``).
_build_result = frozen_builder(
    CompletionResult,
    (
        "job_id",
        "accepted",
        "chain_completed",
        "continuation_id",
        "ready_queues",
        "chain_awaited",
        "due",
        "deferred",
    ),
)


class CompletionOps(EnqueueOps):
    """Complete jobs, alone, in batches, handed on, or atomically."""

    async def complete(
        self,
        tx: TransactionHandle | None,
        *,
        completions: Sequence[Completion],
        notify: NotifyAdapter | None = None,
    ) -> list[CompletionResult]:
        if not completions:
            return []
        with storable(completions):
            return await self._complete(tx, completions, notify)

    async def _complete(
        self,
        tx: TransactionHandle | None,
        completions: Sequence[Completion],
        notify: NotifyAdapter | None,
    ) -> list[CompletionResult]:
        if tx is None and len(completions) == 1 and _plain_hand_on(completions[0]):
            return [await self._hand_on(completions[0], notify)]
        if tx is None and any(c.continuation or c.children for c in completions):
            async with self.transaction() as own:
                return await self.complete(own, completions=completions, notify=notify)
        deferred: list[UUID] = []
        async with self._connection(tx) as conn:
            if len(completions) == 1 and tx is not None:
                [one] = completions
                rows = await self._fetch(
                    conn,
                    self.statements.outcomes.complete_one,
                    {
                        "id": one.job_id,
                        "token": one.lease_token,
                        "output": one.output_json,
                        "ends_chain": one.continuation is None,
                    },
                )
            elif tx is None and all(c.lease_token is not None for c in completions):
                # A worker's batch: a row a caller holds is skipped, not waited on.
                rows = await self._fetch(
                    conn, self.statements.outcomes.complete_skipping, completion_params(completions)
                )
                deferred = [row[0] for row in rows if row[1] is None]
                rows = [row for row in rows if row[1] is not None]
            else:
                rows = await self._fetch(
                    conn, self.statements.outcomes.complete, completion_params(completions)
                )
        results = await self._completion_results(tx, completions, rows)
        if deferred:
            results = mark_deferred(results, deferred)
        if notify is not None:
            chain_ids = {row[0]: row[1] for row in rows}
            # Each queue with how many jobs the completions made ready in it.
            notices = counted_ready(q for r in results for q in r.ready_queues)
            notices += ready_notices((), earliest_due(d for r in results for d in r.due))
            notices += [
                Notice(kind="chain_done", chain_id=chain_ids[r.job_id])
                for r in results
                if r.chain_awaited
            ]
            if notices:
                await notify.publish(tx, notices=notices)
        return results

    async def _hand_on(
        self, completion: Completion, notify: NotifyAdapter | None
    ) -> CompletionResult:
        """Complete a job and insert its continuation in one statement, which also
        announces the continuation when ``notify`` shares this database; any other
        ``notify`` is told after the commit. The chain goes on: no dependant to settle,
        nobody to tell it ended."""
        following = completion.continuation
        assert following is not None
        runs_now = not scheduled(following)
        channel = notify.channel if isinstance(notify, PostgresNotifyAdapter) else None
        # A scheduled continuation is announced with its due time, for a timer.
        [ready_notice] = due_notices([following]) or [
            Notice(kind="ready", queue=following.queue, count=1)
        ]
        params = {
            "id": completion.job_id,
            "token": completion.lease_token,
            "output": completion.output_json,
            "ends_chain": False,
            "next_id": following.id,
            "next_type_name": following.type_name,
            "next_chain_id": following.chain_id,
            "next_chain_type_name": following.chain_type_name,
            "next_chain_index": following.chain_index,
            "next_input": following.input_json,
            "next_queue": following.queue,
            "next_priority": following.priority,
            "next_max_attempts": following.max_attempts,
            "next_run_at": following.run_at,
            "next_run_after": (
                following.run_after.total_seconds() if following.run_after else None
            ),
            "next_trace_context": (
                json.dumps(dict(following.trace_context)) if following.trace_context else None
            ),
            "next_context": json.dumps(dict(following.context)) if following.context else None,
            "next_limit_key": following.limit_key,
            "next_limit_group": following.limit_group,
            "channel": channel,
            "ready": encode_notice(ready_notice) if channel is not None else None,
        }
        async with self._pooled() as conn:
            rows = await self._fetch(conn, self.statements.outcomes.complete_and_continue, params)
        if not rows:
            return CompletionResult(job_id=completion.job_id, accepted=False)
        ready_queues = (following.queue,) if runs_now else ()
        if notify is not None and channel is None:
            await notify.publish(None, notices=[ready_notice])
        return CompletionResult(
            job_id=completion.job_id,
            accepted=True,
            continuation_id=following.id,
            ready_queues=ready_queues,
        )

    async def complete_atomic(
        self, tx: TransactionHandle, *, completion: Completion
    ) -> CompletionResult:
        if completion.continuation is not None or completion.children:
            raise ValueError("complete_atomic takes a completion without continuation or children")
        conn = own_connection(tx)
        params = atomic_completion_params(completion)
        bound = self.operation_timeout
        # psycopg counts a statement it prepares in a pipeline as prepared before the
        # server answers. Were the server to refuse or skip that Parse, the session
        # would lack a name psycopg goes on using: every later run of the statement
        # on this connection would fail. So nothing is prepared here that may not be
        # parsed: the completion in a transaction the handler left aborted, the
        # COMMIT behind a completion that may be refused.
        aborted = conn.info.transaction_status == _INERROR
        try:
            with storable([completion]), translate_errors(self.schema):
                async with bounded(conn, bound, "an atomic attempt's completion and COMMIT"):
                    async with conn.pipeline():
                        cur = conn.cursor()
                        await cur.execute(
                            self.statements.outcomes.complete_atomic,
                            params,
                            prepare=False if aborted else None,
                        )
                        await conn.execute(b"COMMIT", prepare=False)
                    rows = await cur.fetchall()
        except pg_errors.InvalidTextRepresentation as exc:
            if ATOMIC_REFUSED not in str(exc):
                raise
            # The statement failed on purpose: the transaction is aborted, and the
            # COMMIT behind it was never run. End it; nothing in it was written.
            async with bounded(conn, bound):
                await conn.execute(b"ROLLBACK")
            return CompletionResult(job_id=completion.job_id, accepted=False)
        if not any(row[3] and row[4] for row in rows):
            [result] = await self._completion_results(None, [completion], rows)
            return result
        # Committed, and it ended a chain others wait on (a child of a fan-out, a
        # blocker): settle them in a transaction of their own on this connection, which
        # the attempt holds until it returns. A second, pooled one here is a second per
        # slot: with every slot's attempt ending at once on a pool no larger than the
        # slots, each would wait for a connection only another's end gives back.
        await read_committed(conn)
        async with (
            bounded(conn, bound, "settling an atomic attempt's dependants"),
            conn.transaction(),
        ):
            [result] = await self._completion_results(PgTransaction(conn), [completion], rows)
        return result

    async def _completion_results(
        self,
        tx: TransactionHandle | None,
        completions: Sequence[Completion],
        rows: Sequence[tuple[Any, ...]],
        *,
        accepted: dict[int, tuple[Any, bool, bool, bool]] | None = None,
    ) -> list[CompletionResult]:
        """Insert the accepted completions' children and continuations, settle
        dependants of chains that ended, and say what each completion did. ``accepted``
        (the mapping built from ``rows`` below) may be given instead: the turn builds it
        from its arrays.

        Children go first, by the batch insert (COPY from ``COPY_MIN_ROWS``), then the
        continuations: a step blocked on children marks them as having a dependant and
        records its edges, which the children's ends then settle. A child's end cannot
        come before its row is visible, so after this transaction commits."""
        if accepted is None:
            # id -> (chain_id, ends_chain, has_dependants, awaited)
            # Keyed by the ids' integers: ``UUID.__hash__`` and ``__eq__`` are Python
            # methods, and a worker's turn looks up every one of its completions here.
            accepted = {
                row[0].int: (row[1], bool(row[3]), bool(row[4]), bool(row[5])) for row in rows
            }
        children = [
            child
            for c in completions
            if c.children and c.job_id.int in accepted
            for child in c.children
        ]
        if children:
            assert tx is not None
            await self.insert_jobs(tx, jobs=children)
        continuations = [
            c.continuation for c in completions if c.continuation and c.job_id.int in accepted
        ]
        if continuations:
            assert tx is not None
            await self.insert_jobs(tx, jobs=continuations)
        ended_with_dependants = [v[0] for v in accepted.values() if v[1] and v[2]]
        resolution = await self.resolve_dependants(tx, chain_ids=ended_with_dependants)
        unblocked = tuple(sorted(set(resolution.ready_queues)))
        results = []
        for c in completions:
            found = accepted.get(c.job_id.int)
            if found is None:
                results.append(CompletionResult(job_id=c.job_id, accepted=False))
                continue
            chain_id, ends, _, awaited = found
            ready_queues = unblocked
            if c.children:
                ready_queues = tuple(
                    sorted({*ready_queues, *(child.queue for child in c.children)})
                )
            due = resolution.due
            if c.continuation and not scheduled(c.continuation):
                # A step waiting for a signal (without a timeout) or for children is
                # blocked: not ready.
                if c.continuation.wait_signal is None and not c.continuation.blockers:
                    ready_queues = tuple(sorted({c.continuation.queue, *ready_queues}))
            elif c.continuation:
                later = [(n.queue or "", n.at or 0.0) for n in due_notices([c.continuation])]
                due = earliest_due((*due, *later))
            results.append(
                _build_result(
                    c.job_id,
                    True,  # accepted
                    ends,  # chain_completed
                    c.continuation.id if c.continuation else None,  # continuation_id
                    ready_queues,
                    awaited or chain_id in resolution.awaited_chain_ids,  # chain_awaited
                    due,
                    False,  # deferred
                )
            )
        return results


def mark_deferred(
    results: Sequence[CompletionResult], deferred: Iterable[UUID]
) -> list[CompletionResult]:
    """``results`` with those of the ``deferred`` jobs (not written: another
    transaction held the row) marked so; the worker writes them again later."""
    later = {job_id.int for job_id in deferred}
    return [
        CompletionResult(job_id=r.job_id, accepted=False, deferred=True)
        if r.job_id.int in later
        else r
        for r in results
    ]


def completion_params(completions: Sequence[Completion]) -> dict[str, list[Any]]:
    return {
        "ids": [c.job_id for c in completions],
        "tokens": [c.lease_token for c in completions],
        "outputs": [c.output_json for c in completions],
        "ends_chain": [c.continuation is None for c in completions],
    }


def _plain_hand_on(completion: Completion) -> bool:
    """A completion whose continuation ``COMPLETE_AND_CONTINUE`` can insert: a later job
    of the chain with no blocker and no dedup key (what a worker's ``Continue`` makes),
    not waiting for a signal (``insert_jobs`` writes such a step), and no children to
    start with it."""
    following = completion.continuation
    return (
        following is not None
        and not completion.children
        and following.id != following.chain_id
        and not following.blockers
        and following.dedup is None
        and following.wait_signal is None
    )


def atomic_completion_params(completion: Completion) -> dict[str, Any]:
    """Parameters of ``COMPLETE_ATOMIC`` for a plain completion (it ends its chain)."""
    return {
        "id": completion.job_id,
        "token": completion.lease_token,
        "output": completion.output_json,
        "ends_chain": True,
    }
