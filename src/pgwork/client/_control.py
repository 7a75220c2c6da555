"""Client API that steers chains: await, cancel, retry, complete from outside a worker,
trigger scheduled jobs, pause queues, delete chains and purge expired ones.

Mixed into ``Client``. Every operation that takes ``tx`` runs in the caller's
transaction; the notices it publishes (wake-ups, abort requests to the worker holding a
job, chain ends) go out only if that transaction commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio

from pgwork._continuations import continuation_job
from pgwork._limits import check_queue_name
from pgwork.adapters.notify import Notice, ready_notices
from pgwork.adapters.state import Completion
from pgwork.errors import (
    AwaitTimeoutError,
    ChainAlreadyFinishedError,
    ChainDeletedError,
    ChainFailedError,
    ChainHasDependantsError,
    ChainNotFoundError,
    InvalidOptionError,
    JobAlreadyFinishedError,
    JobNotFoundError,
    JobNotRetryableError,
)
from pgwork.job_types import Continuation, JobTypeRegistry
from pgwork.records import AbortReason, Chain, ChainStatus, Job, JobStatus
from pgwork.signals import SignalWait

if TYPE_CHECKING:
    from pgwork.adapters.capabilities import Capabilities
    from pgwork.adapters.notify import NotifyAdapter
    from pgwork.adapters.state import CoreStateAdapter

__all__ = ["ControlMixin"]

# The most chains one ``purge_expired`` call deletes: one transaction, whose locks and
# dead rows grow with it (the workers' own batches are ``RETENTION_BATCH``).
MAX_PURGE = 1_000_000


class ControlMixin:
    """Await, cancel, retry, workerless completion, trigger, pause/resume, deletion."""

    if TYPE_CHECKING:
        state: CoreStateAdapter
        capabilities: Capabilities
        notify: NotifyAdapter
        registry: JobTypeRegistry
        max_payload_bytes: int

        async def get_chain(self, chain_id: UUID, *, tx: object | None = None) -> Chain: ...

        async def get_job(self, job_id: UUID, *, tx: object | None = None) -> Job[Any]: ...

    async def await_chain(
        self, chain_id: UUID, *, timeout: float = 60.0, poll_interval: float = 1.0
    ) -> Any:
        """Wait until the chain ends and return its final output (decoded).

        Wakes on the chain-end notification and polls (backing off to ``poll_interval``)
        in case a notice is missed. Raises ChainFailedError if the chain failed or was
        cancelled, AwaitTimeoutError after ``timeout`` seconds (its ``waiting`` and
        message say what the chain waits for, when it waits for a signal, a time, a
        debounce or blocker chains), ChainNotFoundError when there is no such chain,
        and ChainDeletedError (a ChainNotFoundError) when it was there as the wait
        began and is gone since. Retention keeps an awaited chain at least
        ``pgwork.retention.AWAITED_HOLD`` after it ended, so a wait that reads it
        within that gets its outcome however short its type's retention.
        """
        chain = await self.get_chain(chain_id)
        delay = 0.02
        async with self.notify.listen() as listener:
            # Flag first, then re-read: an end committed in between is seen by the read.
            await self.state.mark_chain_awaited(chain_id=chain_id)
            with anyio.move_on_after(timeout):
                while True:
                    try:
                        chain = await self.get_chain(chain_id)
                    except ChainNotFoundError:
                        raise ChainDeletedError(chain_id) from None
                    if chain.status is ChainStatus.COMPLETED:
                        return chain.output
                    if chain.status is not ChainStatus.ACTIVE:
                        error = chain.current_job.last_attempt_error
                        raise ChainFailedError(
                            chain_id, chain.status.value, error.message if error else None
                        )
                    await listener.wait(delay)
                    delay = min(delay * 2, poll_interval)
        # Say what it waits for, if it waits for something no worker does: a signal
        # not sent yet reads otherwise like a worker that is not running.
        waiting = None
        if self.capabilities.views is not None:
            found = await self.capabilities.views.chain_waits(None, chain_ids=[chain_id])
            waiting = found[0] if found else None
        raise AwaitTimeoutError(chain_id, timeout, chain.status.value, waiting)

    async def cancel(self, tx: object, ids: Sequence[UUID]) -> list[UUID]:
        """Cancel the chains of ``ids`` (chain ids or ids of any of their jobs) in the
        caller's transaction. Pending jobs never run; a running job's worker is told to
        abort its attempt (reason ``cancelled``). Returns the cancelled chain ids."""
        handle = await self.state.adopt(tx)
        refs = await self.state.chains_of(handle, ids=list(ids))
        missing = [r.id for r in refs if r.chain_id is None]
        if missing:
            raise JobNotFoundError(missing)
        ended = [r for r in refs if r.chain_status is not ChainStatus.ACTIVE]
        if ended:
            raise ChainAlreadyFinishedError(
                [r.id for r in ended],
                [r.chain_status.value if r.chain_status else "?" for r in ended],
            )
        wanted = sorted({r.chain_id for r in refs if r.chain_id is not None})
        cancelled, resolution = await self.state.cancel_chains(handle, chain_ids=wanted)
        done = {c.chain_id for c in cancelled}
        lost = [c for c in wanted if c not in done]
        if lost:  # ended between our read and the cancel: the caller should roll back
            raise ChainAlreadyFinishedError(lost, ["ended concurrently"] * len(lost))
        notices = [
            Notice(kind="abort", job_id=job_id, reason=AbortReason.CANCELLED.value)
            for chain in cancelled
            for job_id in chain.job_ids
        ]
        notices += [Notice(kind="chain_done", chain_id=c) for c in sorted(done)]
        notices += ready_notices(resolution.ready_queues, resolution.due)
        await self.notify.publish(handle, notices=notices)
        return sorted(done)

    async def retry(self, tx: object, job_ids: Sequence[UUID], *, front: bool = True) -> list[UUID]:
        """Put failed jobs back to work with a fresh set of attempts, in the caller's
        transaction; ``front=True`` runs them ahead of what already waits in their queue."""
        handle = await self.state.adopt(tx)
        jobs = {job.id: job for job in await self.state.get_jobs(handle, job_ids=list(job_ids))}
        missing = [i for i in job_ids if i not in jobs]
        if missing:
            raise JobNotFoundError(missing)
        not_failed = [j for j in jobs.values() if j.status is not JobStatus.FAILED]
        if not_failed:
            raise JobNotRetryableError([j.id for j in not_failed], [j.status for j in not_failed])
        retried = await self.state.retry_failed(handle, job_ids=list(job_ids), front=front)
        queues = sorted({queue for _, queue in retried})
        await self.notify.publish(handle, notices=[Notice(kind="ready", queue=q) for q in queues])
        return [job_id for job_id, _ in retried]

    async def complete_job(
        self,
        tx: object,
        job_id: UUID,
        output: Any = None,
        *,
        continue_with: Continuation | None = None,
    ) -> None:
        """Complete (or continue) a job from outside any worker — e.g. a webhook — in the
        caller's transaction. A worker holding the job is told to abandon its attempt.
        A continuation cannot wait for child chains (``Children``): only a handler's
        attempt starts children (``ChildNotStartedHereError``)."""
        handle = await self.state.adopt(tx)
        jobs = await self.state.get_jobs(handle, job_ids=[job_id])
        if not jobs:
            raise JobNotFoundError([job_id])
        job = jobs[0]
        if job.status.is_final:
            raise JobAlreadyFinishedError([job_id], [job.status.value])
        job_type = self.registry.get(job.type_name)
        if output is None and continue_with is not None:
            output_json = "null"
        else:
            output_json = job_type.output_codec.encode(output, max_bytes=self.max_payload_bytes)
        if continue_with is not None and isinstance(continue_with.wait, SignalWait):
            self.capabilities.require_signals("continuing a chain with wait_for")
        continuation = (
            continuation_job(
                self.registry, job_type, job, continue_with, max_bytes=self.max_payload_bytes
            )
            if continue_with is not None
            else None
        )
        results = await self.state.complete(
            handle,
            completions=[Completion(job_id, None, output_json, continuation)],
        )
        result = results[0]
        if not result.accepted:  # ended between our read and the write
            current = await self.get_job(job_id, tx=handle)
            raise JobAlreadyFinishedError([job_id], [current.status.value])
        notices = ready_notices(result.ready_queues, result.due)
        if job.status is JobStatus.RUNNING:
            notices.append(
                Notice(kind="abort", job_id=job_id, reason=AbortReason.COMPLETED_ELSEWHERE.value)
            )
        if result.chain_completed:
            notices.append(Notice(kind="chain_done", chain_id=job.chain_id))
        if continuation is not None and continuation.wait_signal is not None:
            # The step's name is matched once this transaction commits (a worker hears
            # it): a signal sent before it is waiting for it.
            notices.append(Notice(kind="signal", name=continuation.wait_signal))
        await self.notify.publish(handle, notices=notices)

    async def trigger(self, tx: object, job_ids: Sequence[UUID]) -> None:
        """Make scheduled jobs due now (in the caller's transaction)."""
        handle = await self.state.adopt(tx)
        queues = await self.state.trigger(handle, job_ids=list(job_ids))
        await self.notify.publish(handle, notices=[Notice(kind="ready", queue=q) for q in queues])

    async def pause_queue(self, queue: str, *, tx: object | None = None) -> None:
        """Stop workers taking jobs from ``queue`` (running attempts go on). Survives
        restarts: the pause is a row in the database. A name no job could have (empty,
        padded, with control characters: see ``job_type``'s ``queue``) raises
        InvalidOptionError and pauses nothing."""
        check_queue_name(queue, where="pause_queue")
        handle = await self.state.adopt(tx) if tx is not None else None
        await self.state.set_queue_paused(handle, queue=queue, paused=True)

    async def resume_queue(self, queue: str, *, tx: object | None = None) -> None:
        """Let workers take jobs from ``queue`` again. Any name is accepted, so a pause
        stored before names were checked can still be lifted."""
        handle = await self.state.adopt(tx) if tx is not None else None
        await self.state.set_queue_paused(handle, queue=queue, paused=False)
        await self.notify.publish(handle, notices=[Notice(kind="ready", queue=queue)])

    # --- deletion ----------------------------------------------------------------------

    async def delete_chains(
        self, tx: object, chain_ids: Sequence[UUID], *, cascade: bool = False
    ) -> int:
        """Delete whole chains (every job, active or not) in the caller's transaction
        ``tx``; returns how many chains were deleted, dependants included.

        A job of another chain that waits for one of these chains, or may still run
        and read its output (blocked, pending, running, or failed and retryable), makes
        this raise ChainHasDependantsError and delete nothing, unless ``cascade=True``:
        then those jobs' chains are deleted too, and their dependants', and so on.
        Unknown ids raise ChainNotFoundError and delete nothing. A worker running a
        deleted job finds out when it next renews or completes (its lease is lost).
        """
        handle = await self.state.adopt(tx)
        result = await self.state.delete_chains(handle, chain_ids=list(chain_ids), cascade=cascade)
        if result.missing:
            raise ChainNotFoundError(result.missing)
        if result.dependants and not cascade:
            deps = result.dependants
            raise ChainHasDependantsError(
                chain_ids=list(dict.fromkeys(d.blocker_chain_id for d in deps)),
                dependant_job_ids=list(dict.fromkeys(d.job_id for d in deps)),
                dependant_chain_ids=list(dict.fromkeys(d.chain_id for d in deps)),
            )
        return result.deleted_chains

    async def purge_expired(self, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` chains that ended (completed, failed or cancelled)
        longer ago than their type's ``retention`` gives for how they ended; returns how
        many (call again while it returns ``limit``).

        Types declared with ``Retention.forever()`` keep their chains. A chain another
        chain's job still depends on is kept until that job has finished, and so are
        chains whose dedup window is open and awaited chains that just ended
        (``pgwork.retention``). Safe to call from every worker: one call runs at a time
        per schema, the others return 0 at once.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PURGE:
            raise InvalidOptionError(
                "limit",
                limit,
                f"an integer from 1 to {MAX_PURGE:,} (chains deleted in one transaction)",
                "Client.purge_expired",
            )
        retention = {t.name: t.retention for t in self.registry if not t.retention.keeps_everything}
        if not retention:
            return 0
        return await self.capabilities.require_maintenance(
            "Client.purge_expired"
        ).delete_expired_chains(retention=retention, limit=limit)
