"""The next job of a chain, and when a job runs: what the client and the worker share.

A chain goes on from two places: ``Client.complete_job(continue_with=...)`` outside a
worker, and ``attempt.complete(continue_with=...)`` inside one. Both build the next job
with ``continuation_job``, checked against the registry's ``continue_with``. A schedule
is given to ``start_chain`` and to ``attempt.reschedule``; ``split_schedule`` checks
both the same way. Below the client and the worker, which import it downward.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pgwork._ids import new_id
from pgwork._limits import (
    check_context,
    check_delay,
    check_limit_key,
    check_max_attempts,
    check_priority,
    check_queue_name,
    check_run_at,
)
from pgwork.adapters.state import NewJob
from pgwork.errors import (
    ChildNotStartedHereError,
    ChildWaitNotAllowedError,
    ConfigurationError,
    WaitNotDeclaredError,
)
from pgwork.fan_out import Children
from pgwork.job_types import Continuation, JobType, JobTypeRegistry
from pgwork.records import Job

__all__ = ["Schedule", "child_job", "continuation_job", "split_schedule"]

Schedule = datetime | timedelta | None
"""When a job runs: a timezone-aware datetime, a delay from now, or None for now."""


def continuation_job(
    registry: JobTypeRegistry,
    from_type: JobType[Any, Any],
    job: Job[Any],
    spec: Continuation,
    *,
    max_bytes: int,
    started: Collection[UUID] = (),
) -> NewJob:
    """The next job of ``job``'s chain, checked against the registry's ``continue_with``.

    It keeps the chain's logging context and ``job``'s limit key, unless ``spec``
    gives a key of its own: a chain's later steps usually call the same tenant's (or
    host's) service, and their limits should count them there too.

    A continuation that waits for a signal (``Continue(..., wait_for=...)``) must go to
    a type that declares ``waits_for=`` that signal type (``WaitNotDeclaredError``);
    its timeout becomes its schedule. One that waits for child chains
    (``wait_for=Children(...)``) is blocked on them: each must be among ``started``,
    the chains the attempt started (``ChildNotStartedHereError``), and its type must
    not wait for a signal (``ChildWaitNotAllowedError``)."""
    if not isinstance(spec, Continuation):
        raise ConfigurationError(
            f"continue_with must be Continue(job_type, input), got {type(spec).__name__}"
        )
    target = registry.continuation(from_type, spec.job_type, job.id)
    run_after = spec.schedule_after
    wait = spec.wait
    wait_signal = None
    blockers: tuple[UUID, ...] = ()
    need = None
    if isinstance(wait, Children):
        foreign = [chain_id for chain_id in wait.chain_ids if chain_id not in started]
        if foreign:
            raise ChildNotStartedHereError(foreign, job.id)
        if target.waits_for is not None:
            raise ChildWaitNotAllowedError(target.name, target.waits_for.name, job.id)
        blockers = wait.chain_ids
        need = wait.need
    elif wait is not None:
        if target.waits_for is None or target.waits_for is not wait.signal_type:
            raise WaitNotDeclaredError(
                target.name,
                wait.signal_type.name,
                None if target.waits_for is None else target.waits_for.name,
                job.id,
            )
        wait_signal = wait.name
        run_after = wait.timeout
    return NewJob(
        id=new_id(),
        type_name=target.name,
        chain_id=job.chain_id,
        chain_type_name=job.chain_type_name,
        chain_index=job.chain_index + 1,
        input_json=target.input_codec.encode(spec.input, max_bytes=max_bytes),
        queue=target.queue,
        priority=target.priority,
        max_attempts=target.max_attempts,
        run_after=run_after,
        context=job.context,
        limit_key=(key := job.limit_key if spec.limit_key is None else spec.limit_key),
        limit_group=target.limit_group(key),
        wait_signal=wait_signal,
        blockers=blockers,
        blocker_failure=target.blocker_failure,
        blocker_need=need,
    )


def child_job(
    registry: JobTypeRegistry,
    job_type: JobType[Any, Any],
    input: Any,
    parent: Job[Any],
    *,
    max_bytes: int,
    trace_context: Mapping[str, str] | None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    context: Mapping[str, str] | None = None,
    limit_key: str | None = None,
) -> NewJob:
    """The first job of a new chain that ``parent``'s attempt starts
    (``attempt.start_chain``), checked as ``client.start_chain`` checks one: an entry
    type of the registry, its input, each option (``ChildOptions``). It keeps the
    parent's logging context and limit key, and its trace, unless given its own."""
    resolved = registry.entry(job_type)
    input_json = resolved.input_codec.encode(input, max_bytes=max_bytes)
    where = f"attempt.start_chain({resolved.name!r})"
    if queue is not None:
        check_queue_name(queue, where=where)
    if priority is not None:
        check_priority(priority, where=where)
    if max_attempts is not None:
        check_max_attempts(max_attempts, where=where)
    if context is not None:
        context = check_context(context, where=where)
    if limit_key is not None:
        limit_key = check_limit_key(limit_key, where=where)
    key = parent.limit_key if limit_key is None else limit_key
    job_id = new_id()
    return NewJob(
        id=job_id,
        type_name=resolved.name,
        chain_id=job_id,
        chain_type_name=resolved.name,
        chain_index=0,
        input_json=input_json,
        queue=resolved.queue if queue is None else queue,
        priority=resolved.priority if priority is None else priority,
        max_attempts=max_attempts or resolved.max_attempts,
        trace_context=trace_context,
        blocker_failure=resolved.blocker_failure,
        context=parent.context if context is None else context,
        limit_key=key,
        limit_group=resolved.limit_group(key),
    )


def split_schedule(schedule: Schedule) -> tuple[datetime | None, timedelta | None]:
    """Turn ``schedule`` into (run_at, run_after); the database clock resolves both."""
    if schedule is None:
        return None, None
    if isinstance(schedule, datetime):
        if schedule.tzinfo is None or schedule.utcoffset() is None:
            raise ConfigurationError(
                f"schedule datetime {schedule.isoformat()} has no timezone; pass an aware "
                "datetime (e.g. datetime.now(UTC) + ...) or a timedelta"
            )
        return check_run_at(schedule), None
    if isinstance(schedule, timedelta):
        return None, max(check_delay("schedule", schedule), timedelta(0))
    raise ConfigurationError(f"schedule must be a datetime or timedelta, got {schedule!r}")
