"""Turning result rows into pgwork records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from pgwork._frozen import frozen_builder
from pgwork.adapters.state import AcquiredJob
from pgwork.records import (
    AttemptError,
    Chain,
    ChainStatus,
    Job,
    JobStatus,
    UndecodablePayload,
    history_from_json,
)

JOB_WIDTH = 25  # columns in sql.fragments._JOB_COLUMNS


def job_from_row(row: Sequence[Any], offset: int = 0) -> Job[Any]:
    r = row[offset : offset + JOB_WIDTH]
    return Job(
        id=r[0],
        type_name=r[1],
        chain_id=r[2],
        chain_type_name=r[3],
        chain_index=r[4],
        input=parse_stored_json(r[5]),
        output=parse_stored_json(r[6]),
        status=JobStatus(r[7]),
        queue=r[8],
        priority=r[9],
        created_at=r[10],
        scheduled_at=r[11],
        started_at=r[12],
        completed_at=r[13],
        attempt=r[14],
        max_attempts=r[15],
        last_attempt_error=AttemptError.from_json(r[16]),
        last_attempt_at=r[17],
        leased_by=r[18],
        leased_until=r[19],
        dedup_key=r[20],
        context=r[21],
        attempt_history=history_from_json(parse_stored_json(r[22])),
        limit_key=r[23],
        debounce_deadline=r[24],
    )


def chain_from_row(row: Sequence[Any]) -> Chain:
    root = job_from_row(row, 2)
    current = job_from_row(row, 2 + JOB_WIDTH)
    status = ChainStatus(row[0])
    return Chain(
        id=root.id,
        type_name=root.chain_type_name,
        status=status,
        input=root.input,
        output=current.output if status is ChainStatus.COMPLETED else None,
        created_at=root.created_at,
        completed_at=row[1],
        current_job=current,
        dedup_key=root.dedup_key,
    )


# The acquire's columns, in order (``sql.leases``' acquire statements return them
# after their own leading columns). A worker builds one ``AcquiredJob`` per job: the
# builder sets its fields without the frozen ``__init__``'s ``object.__setattr__``.
_build_acquired = frozen_builder(
    AcquiredJob,
    (
        "id",
        "type_name",
        "chain_id",
        "chain_type_name",
        "chain_index",
        "input",
        "queue",
        "priority",
        "attempt",
        "max_attempts",
        "lease_token",
        "leased_until",
        "created_at",
        "scheduled_at",
        "last_attempt_error",
        "trace_context",
        "started_at",
        "last_attempt_at",
        "dedup_key",
        "context",
        "limit_key",
    ),
)


def acquired_from_row(row: Sequence[Any]) -> AcquiredJob:
    return acquired_from_rows([row])[0]


def acquired_from_rows(rows: Sequence[Sequence[Any]], skip: int = 0) -> list[AcquiredJob]:
    """The acquired jobs of an acquire's rows, each row's first ``skip`` columns left
    out (the turn statement leads with its head's).

    A worker decodes one row per job it runs: each row is unpacked in one step (twenty
    subscripts cost more than the record they fill) and the usual empty
    ``last_attempt_error`` skips its parser."""
    build = _build_acquired
    jobs = []
    for row in rows:
        (
            job_id,
            type_name,
            chain_id,
            chain_type_name,
            chain_index,
            input_text,
            queue,
            priority,
            attempt,
            max_attempts,
            lease_token,
            leased_until,
            created_at,
            scheduled_at,
            last_error,
            trace_context,
            started_at,
            last_attempt_at,
            dedup_key,
            context,
            limit_key,
        ) = row[skip:] if skip else row
        jobs.append(
            build(
                job_id,
                type_name,
                chain_id,
                chain_type_name,
                chain_index,
                parse_stored_json(input_text),
                queue,
                priority,
                attempt,
                max_attempts,
                lease_token,
                leased_until,
                created_at,
                scheduled_at,
                None if last_error is None else AttemptError.from_json(last_error),
                trace_context,
                started_at,
                last_attempt_at,
                dedup_key,
                context,
                limit_key,
            )
        )
    return jobs


def parse_stored_json(text: str | None) -> Any:
    """Parse one stored JSON text, or stand in an ``UndecodablePayload`` for it.

    The acquire and every listing read inputs (and outputs) as text and parse them
    here, one row at a time: parsed by the driver, one undecodable value (say, nested
    5,000 deep by a hand-written INSERT) would fail the whole fetch: every job leased
    with it would wait for its lease to expire, losing an attempt for nothing, and a
    listing or the dashboard could not show any of its rows.
    """
    if text is None:
        return None
    try:
        # pydantic-core's parser, a tenth of ``json.loads``'s cost on a small input.
        # It gives up past 200 levels of nesting (stored inputs may have up to
        # MAX_PAYLOAD_DEPTH), and on anything else it refuses, ``json.loads`` decides.
        return from_json(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except (RecursionError, ValueError) as exc:
        reason = "nested too deeply to parse" if isinstance(exc, RecursionError) else str(exc)
        return UndecodablePayload(f"invalid JSON: {reason}")
