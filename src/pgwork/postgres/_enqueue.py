"""Writing new job rows: one multi-row statement, or COPY for large plain batches.

Three paths give identical rows (a test holds them to it):

- ``INSERT_JOBS`` takes one array per column in binary format (psycopg dumps a binary
  array of a thousand values several times faster than a text one, and the parameter
  count stays fixed). The same statement announces the ready queues with
  ``pg_notify``, so enqueue and wake-up cost one round trip, delivered only on commit.
  ``INSERT_JOB`` is the same for a single job, with scalar parameters.
- ``COPY ... FROM STDIN`` for at least ``COPY_MIN_ROWS`` jobs that need nothing the
  database clock must compute (no schedule) and no blocker bookkeeping: PostgreSQL
  skips the executor, and psycopg streams rows while the batch is still being
  formatted, so the server inserts while Python works.

A single ``start_chain`` + commit is three round trips: psycopg's implicit ``BEGIN``,
the insert (with its notice), the caller's ``COMMIT``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg

from pgwork.adapters.notify import Notice
from pgwork.adapters.state import NewJob
from pgwork.postgres._errors import translate_errors
from pgwork.postgres._statements import Statements
from pgwork.postgres.notify import encode_notice

__all__ = ["COPY_MIN_ROWS", "INSERT_CHUNK", "insert_params", "ready_queues", "write_jobs"]

# Rows per INSERT statement: the statement has a fixed number of (array) parameters,
# so this only bounds the size of one message, not PostgreSQL's parameter limit.
INSERT_CHUNK = 5000

# Below this many rows COPY's extra round trips (start, finish, a separate pg_notify)
# cost more than they save (A/B runs: COPY already wins at 100 rows).
COPY_MIN_ROWS = 64


def ready_queues(jobs: Iterable[NewJob]) -> list[str]:
    """The queues that get a job runnable now: neither blocked nor scheduled."""
    return sorted(
        {
            job.queue
            for job in jobs
            if not job.blockers and job.run_at is None and job.run_after is None
        }
    )


def insert_params(
    jobs: Sequence[NewJob], *, channel: str | None = None, ready: Sequence[str] = ()
) -> dict[str, Any]:
    """Parameters of ``INSERT_JOBS``: one list per column, plus the ``ready`` queues to
    announce on ``channel`` (none without one)."""
    return {
        "ids": [j.id for j in jobs],
        "type_names": [j.type_name for j in jobs],
        "chain_ids": [j.chain_id for j in jobs],
        "chain_type_names": [j.chain_type_name for j in jobs],
        "chain_indexes": [j.chain_index for j in jobs],
        "inputs": [j.input_json for j in jobs],
        "queues": [j.queue for j in jobs],
        "priorities": [j.priority for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "run_ats": [j.run_at for j in jobs],
        "run_afters": [j.run_after.total_seconds() if j.run_after else None for j in jobs],
        "dedup_keys": [j.dedup.key if j.dedup else None for j in jobs],
        "statuses": ["blocked" if j.blockers else "pending" for j in jobs],
        "trace_contexts": [
            json.dumps(dict(j.trace_context)) if j.trace_context else None for j in jobs
        ],
        "channel": channel,
        "ready": _encoded(ready) if channel else [],
    }


# COPY's text format: backslash escapes for the four characters that would end a
# field or a row; ``\N`` is NULL.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NULL = "\\N"

# Rows per write: small enough that the server inserts the first rows while Python
# formats the next, large enough that each write is worth its call. The first write is
# smaller still: until it arrives the server has nothing to do.
_COPY_ROWS_PER_WRITE = 250
_COPY_FIRST_WRITE = 50


def _field(value: str) -> str:
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_ESCAPES)
    return value


def _copy_lines(jobs: Sequence[NewJob]) -> str:
    """``jobs`` as COPY text rows in COPY_JOBS's column order.

    Formatted here rather than by psycopg's ``write_row`` (which dumps each value
    through its adapter, uuids in Python): a uuid goes as 32 hex digits, which
    PostgreSQL accepts, and the strings a batch repeats are escaped once.
    """
    seen: dict[str, str] = {}
    traces: dict[int, str] = {}
    lines = []
    for j in jobs:
        type_name = seen.get(j.type_name) or seen.setdefault(j.type_name, _field(j.type_name))
        chain_type = seen.get(j.chain_type_name) or seen.setdefault(
            j.chain_type_name, _field(j.chain_type_name)
        )
        queue = seen.get(j.queue) or seen.setdefault(j.queue, _field(j.queue))
        job_id = format(j.id.int, "032x")
        if j.id == j.chain_id:
            chain_id, chain_status = job_id, "active"
        else:
            chain_id, chain_status = format(j.chain_id.int, "032x"), _NULL
        dedup = _field(j.dedup.key) if j.dedup else _NULL
        trace = _NULL
        if j.trace_context:
            trace = traces.get(id(j.trace_context)) or traces.setdefault(
                id(j.trace_context), _field(json.dumps(dict(j.trace_context)))
            )
        lines.append(
            f"{job_id}\t{type_name}\t{chain_id}\t{chain_type}\t{j.chain_index:d}\t"
            f"{_field(j.input_json)}\tpending\t{queue}\t{j.priority:d}\t{j.max_attempts:d}\t"
            f"{chain_status}\t{dedup}\t{trace}\n"
        )
    return "".join(lines)


async def write_jobs(
    conn: psycopg.AsyncConnection[Any],
    statements: Statements,
    schema: str,
    jobs: Sequence[NewJob],
    *,
    channel: str | None,
    ready: Sequence[str],
    meanwhile: Callable[[], object] | None = None,
) -> bool:
    """Insert ``jobs`` (already deduplicated) in ``conn``'s transaction.

    With ``channel``, announce the ``ready`` queues on it in one of this call's
    statements; returns whether it did (False: the caller must publish them itself,
    if there are any). ``meanwhile`` is called once: with COPY, after the last row
    is sent and before waiting for the server to finish inserting them, so that its
    work overlaps the server's; otherwise after the statements.
    """
    if not jobs:
        if meanwhile is not None:
            meanwhile()
        return False
    plain: list[NewJob] = []
    rest: list[NewJob] = []
    for j in jobs:
        (rest if j.blockers or j.run_at is not None or j.run_after is not None else plain).append(j)
    if len(plain) < COPY_MIN_ROWS:
        plain, rest = [], list(jobs)
    announced = False
    with translate_errors(schema):
        if plain:
            if channel is not None and ready and not rest:
                params = {"channel": channel, "ready": _encoded(ready)}
                await _execute(conn, statements.notify_ready, params)
                announced = True
            async with conn.cursor() as cur, cur.copy(statements.copy_jobs) as copy:
                start, end = 0, _COPY_FIRST_WRITE
                while start < len(plain):
                    await copy.write(_copy_lines(plain[start:end]))
                    start, end = end, end + _COPY_ROWS_PER_WRITE
                if meanwhile is not None:
                    meanwhile()
                    meanwhile = None
        single = len(rest) == 1 and len(ready) <= 1
        if single:
            await _execute(conn, statements.insert_job, _one(rest[0], channel, ready))
            announced = channel is not None
        for start in range(0, 0 if single else len(rest), INSERT_CHUNK):
            params = insert_params(
                rest[start : start + INSERT_CHUNK],
                channel=channel if start == 0 else None,
                ready=ready,
            )
            await _execute(conn, statements.insert_jobs, params)
            announced = channel is not None
    if meanwhile is not None:
        meanwhile()
    return announced


def _one(j: NewJob, channel: str | None, ready: Sequence[str]) -> dict[str, Any]:
    """Parameters of ``INSERT_JOB``, which announces at most one queue."""
    return {
        "id": j.id,
        "type_name": j.type_name,
        "chain_id": j.chain_id,
        "chain_type_name": j.chain_type_name,
        "chain_index": j.chain_index,
        "input": j.input_json,
        "status": "blocked" if j.blockers else "pending",
        "queue": j.queue,
        "priority": j.priority,
        "max_attempts": j.max_attempts,
        "run_at": j.run_at,
        "run_after": j.run_after.total_seconds() if j.run_after else None,
        "dedup_key": j.dedup.key if j.dedup else None,
        "trace_context": json.dumps(dict(j.trace_context)) if j.trace_context else None,
        "channel": channel,
        "ready": _encoded(ready)[0] if channel and ready else None,
    }


def _encoded(ready: Sequence[str]) -> list[str]:
    return [encode_notice(Notice(kind="ready", queue=q)) for q in ready]


async def _execute(
    conn: psycopg.AsyncConnection[Any], query: bytes, params: dict[str, Any]
) -> None:
    """Run one statement whose rows nobody reads.

    Not in pipeline mode: psycopg syncs right after the implicit ``BEGIN`` it queues,
    so a pipeline saves no round trip here and costs CPU.
    """
    async with conn.cursor() as cur:
        await cur.execute(query, params)
