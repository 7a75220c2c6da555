"""Turning result rows into pgwork records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from pgwork.adapters.state import AcquiredJob
from pgwork.records import AttemptError, Chain, ChainStatus, Job, JobStatus, UndecodablePayload

JOB_WIDTH = 22  # columns in _statements._JOB_COLUMNS


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


def acquired_from_row(row: Sequence[Any]) -> AcquiredJob:
    return AcquiredJob(
        id=row[0],
        type_name=row[1],
        chain_id=row[2],
        chain_type_name=row[3],
        chain_index=row[4],
        input=parse_stored_json(row[5]),
        queue=row[6],
        priority=row[7],
        attempt=row[8],
        max_attempts=row[9],
        lease_token=row[10],
        leased_until=row[11],
        created_at=row[12],
        scheduled_at=row[13],
        last_attempt_error=AttemptError.from_json(row[14]),
        trace_context=row[15],
        started_at=row[16],
        last_attempt_at=row[17],
        dedup_key=row[18],
        context=row[19],
    )


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
