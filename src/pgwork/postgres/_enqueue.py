"""Writing new job rows: one multi-row statement, or COPY for large plain batches.

Three paths give identical rows (a test holds them to it):

- ``INSERT_JOBS`` takes one array per column, each an array literal formatted here as
  one text parameter (cheaper than psycopg's dumping of lists, and the same for every
  driver; the parameter count stays fixed). The same statement announces the ready queues with
  ``pg_notify``, so enqueue and wake-up cost one round trip, delivered only on commit.
  ``INSERT_JOB`` is the same for a single job, with scalar parameters, and
  ``INSERT_PLAIN_JOB`` for a single plain job, and ``INSERT_PLAIN_ROOT`` for the
  commonest of them (``plain_job_statement``): one ``start_chain`` of a job runnable
  now, with as little as possible between the caller and its one statement.
  ``INSERT_PLAIN_JOBS`` is ``INSERT_JOBS`` for a batch of such jobs (each a new chain's
  first job): six arrays fewer.
- ``COPY ... FROM STDIN`` for at least ``COPY_MIN_ROWS`` jobs that need nothing the
  database clock must compute (no schedule) and no blocker bookkeeping: PostgreSQL
  skips the executor, and psycopg streams rows while the batch is still being
  formatted, so the server inserts while Python works. ``insert_streamed`` goes
  further for a batch whose first ``COPY_MIN_ROWS`` jobs are plain: it takes the jobs
  from the client's iterator as it writes them, so building the jobs overlaps the
  server's inserting too; the few jobs of such a batch that are not plain are set aside
  for the caller to insert afterwards.

A single ``start_chain`` + commit is three round trips: psycopg's implicit ``BEGIN``,
the insert (with its notice), the caller's ``COMMIT``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from functools import lru_cache
from itertools import chain, islice
from typing import Any

import psycopg

from pgwork.adapters.notify import Notice
from pgwork.adapters.state import DedupSpec, InsertedJob, NewJob
from pgwork.postgres._callers import DbConn, can_copy, execute
from pgwork.postgres._errors import translate_errors
from pgwork.postgres.notify import encode_notice
from pgwork.postgres.sql.enqueue import EnqueueStatements
from pgwork.records import JobStatus

__all__ = [
    "COPY_MIN_ROWS",
    "INSERT_CHUNK",
    "Streamed",
    "due_notices",
    "insert_params",
    "insert_streamed",
    "is_plain",
    "plain_job_statement",
    "ready_notice",
    "ready_queues",
    "write_jobs",
]

# Rows per INSERT statement: the statement has a fixed number of (array) parameters,
# so this only bounds the size of one message, not PostgreSQL's parameter limit.
INSERT_CHUNK = 5000

# Below this many rows COPY's extra round trips (start, finish, a separate pg_notify)
# cost more than they save. Against INSERT_JOBS with array literals (client and server
# CPU per job measured in one process, alternating): at 10 and 100 rows the
# INSERT costs the client 15-25 % less and the server no more; at 300 they cost the
# same; at 1,000 COPY costs the server a quarter less per row (no arrays to parse and
# unnest) and its streaming (the server inserts while the client formats) keeps its
# wall clock ahead.
COPY_MIN_ROWS = 250


def is_plain(job: NewJob) -> bool:
    """Whether ``job`` can go by COPY as it is: runnable now, no blocker, no dedup key,
    not waiting for a signal."""
    return (
        not job.blockers
        and job.run_at is None
        and job.run_after is None
        and not job.dedup
        and job.wait_signal is None
    )


def _plain_root(job: NewJob) -> bool:
    """Whether ``job`` is plain and starts its own chain (``INSERT_PLAIN_JOBS``)."""
    return (
        (job.chain_id is job.id or job.chain_id == job.id)  # the client passes one object
        and not job.blockers
        and job.run_at is None
        and job.run_after is None
        and not job.dedup
    )


def ready_queues(jobs: Iterable[NewJob]) -> list[str]:
    """The queues that get a job runnable now: neither blocked nor scheduled."""
    return sorted(
        {
            job.queue
            for job in jobs
            if not job.blockers and job.run_at is None and job.run_after is None
        }
    )


def due_notices(jobs: Iterable[NewJob]) -> list[Notice]:
    """For each queue that gets a scheduled (not blocked) job, a ``ready`` notice with
    the earliest due time among them: no other notification will say when it is due."""
    earliest: dict[str, float] = {}
    now = time.time()
    for job in jobs:
        if job.blockers or (job.run_at is None and job.run_after is None):
            continue
        due = now + (job.run_after.total_seconds() if job.run_after is not None else 0.0)
        if job.run_at is not None:
            run_at = job.run_at if job.run_at.tzinfo else job.run_at.replace(tzinfo=UTC)
            due = max(due, run_at.timestamp())
        if due < earliest.get(job.queue, math.inf):
            earliest[job.queue] = due
    return [Notice(kind="ready", queue=q, at=at) for q, at in sorted(earliest.items())]


def insert_params(
    jobs: Sequence[NewJob],
    *,
    channel: str | None = None,
    ready: Sequence[str] = (),
    plain: bool = False,
) -> dict[str, Any]:
    """Parameters of ``INSERT_JOBS``: one array literal per column, plus the ``ready``
    queues to announce on ``channel`` (none without one). With ``plain``, those of
    ``INSERT_PLAIN_JOBS``: the jobs are all plain (``is_plain``) and each the first job
    of a new chain, so their chain ids, indexes, statuses, schedules and dedup keys go
    without saying."""
    jsons: dict[int, str] = {}

    def as_json(value: Mapping[str, str]) -> str:
        return jsons.get(id(value)) or jsons.setdefault(
            id(value), _element(json.dumps(dict(value)))
        )

    params = {
        "ids": _array([format(j.id.int, "032x") for j in jobs]),
        "type_names": _repeated([j.type_name for j in jobs]),
        "chain_type_names": _repeated([j.chain_type_name for j in jobs]),
        "inputs": _quoted([j.input_json for j in jobs]),
        "queues": _repeated([j.queue for j in jobs]),
        "priorities": _array([str(j.priority) for j in jobs]),
        "max_attempts": _array([str(j.max_attempts) for j in jobs]),
        "trace_contexts": _array(
            [as_json(j.trace_context) if j.trace_context else "NULL" for j in jobs]
        ),
        "contexts": _array([as_json(j.context) if j.context else "NULL" for j in jobs]),
        "limit_keys": _limit_keys([j.limit_key for j in jobs]),
        "limit_groups": _limit_keys([j.limit_group for j in jobs]),
        "channel": channel,
        "ready": _array([_element(notice) for notice in _encoded(ready)] if channel else []),
    }
    if plain:
        return params
    params["chain_ids"] = _array([format(j.chain_id.int, "032x") for j in jobs])
    params["chain_indexes"] = _array([str(j.chain_index) for j in jobs])
    params["run_ats"] = _array(
        ["NULL" if j.run_at is None else _element(j.run_at.isoformat()) for j in jobs]
    )
    params["run_afters"] = _array(
        ["NULL" if j.run_after is None else repr(j.run_after.total_seconds()) for j in jobs]
    )
    params["dedup_keys"] = _array(
        ["NULL" if j.dedup is None else _element(j.dedup.key) for j in jobs]
    )
    params["dedup_holds"] = _array([_hold_element(dedup_hold(j)) for j in jobs])
    params["statuses"] = _array(["blocked" if j.blockers else "pending" for j in jobs])
    return params


def dedup_hold(job: NewJob) -> float | None:
    """Seconds retention keeps ``job``'s chain for its dedup key: the window of a
    ``DedupSpec`` with ``scope="window"``, infinity for ``"ever"``; None otherwise (a
    key matched only while its chain is active, or a debounce's key, holds nothing
    once the chain ended)."""
    dedup = job.dedup
    if not isinstance(dedup, DedupSpec):
        return None
    if dedup.scope == "ever":
        return math.inf
    if dedup.scope == "window" and dedup.window is not None:
        return dedup.window.total_seconds()
    return None


def _hold_element(hold: float | None) -> str:
    if hold is None:
        return "NULL"
    return "Infinity" if hold == math.inf else repr(hold)


def _limit_keys(keys: Sequence[str | None]) -> str:
    """The array literal of jobs' limit keys or groups (NULL for none), each quoted
    once: a batch mostly repeats a few keys, or has none at all."""
    quoted: dict[str | None, str] = {None: "NULL"}
    elements = []
    for key in keys:
        element = quoted.get(key)
        if element is None:
            assert key is not None
            element = quoted[key] = _element(key)
        elements.append(element)
    return _array(elements)


def _array(elements: list[str]) -> str:
    """A one-dimensional array literal of ``elements`` (each already an element)."""
    return "{" + ",".join(elements) + "}"


def _repeated(values: list[str]) -> str:
    """An array literal of ``values``, strings a batch repeats (each quoted once)."""
    first = values[0] if values else ""
    if values.count(first) == len(values):  # the usual batch: one value throughout
        return _array([_element(first)] * len(values))
    quoted = {value: _element(value) for value in set(values)}
    return _array([quoted[value] for value in values])


# Joins the values of ``_quoted``: no text a PostgreSQL ``text`` can hold contains it.
_SEPARATOR = "\x00"


def _quoted(values: list[str]) -> str:
    """An array literal of ``values`` (none NULL), every element quoted.

    The values are joined first and escaped in one pass over the joined text, instead
    of one check and two replacements per value: JSON inputs always contain double
    quotes, so every one of them needed escaping. Should a value itself contain the
    separator (PostgreSQL would refuse it anyway), each is escaped on its own, so the
    array keeps one element per value.
    """
    joined = _SEPARATOR.join(values)
    if joined.count(_SEPARATOR) != len(values) - 1:
        return _array([_element(value) for value in values])
    if "\\" in joined:
        joined = joined.replace("\\", "\\\\")
    return '{"' + joined.replace('"', '\\"').replace(_SEPARATOR, '","') + '"}'


def _element(value: str) -> str:
    """``value`` as a double-quoted element of an array literal: inside the quotes only
    a backslash and a double quote need escaping."""
    if "\\" in value or '"' in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{value}"'


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
        context = _NULL
        if j.context:
            context = traces.get(id(j.context)) or traces.setdefault(
                id(j.context), _field(json.dumps(dict(j.context)))
            )
        key = j.limit_key
        limit_key = _NULL if key is None else seen.get(key) or seen.setdefault(key, _field(key))
        group = j.limit_group
        limit_group = (
            _NULL if group is None else seen.get(group) or seen.setdefault(group, _field(group))
        )
        lines.append(
            f"{job_id}\t{type_name}\t{chain_id}\t{chain_type}\t{j.chain_index:d}\t"
            f"{_field(j.input_json)}\tpending\t{queue}\t{j.priority:d}\t{j.max_attempts:d}\t"
            f"{chain_status}\t{dedup}\t{trace}\t{context}\t{limit_key}\t{limit_group}\n"
        )
    return "".join(lines)


async def write_jobs(
    conn: DbConn,
    statements: EnqueueStatements,
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
    if len(plain) < COPY_MIN_ROWS or not can_copy(conn):
        plain, rest = [], list(jobs)
    announced = False
    with translate_errors(schema):
        if plain:
            if channel is not None and ready and not rest:
                await _announce(conn, statements, channel, ready)
                announced = True
            await _copy(conn, statements, iter(plain), meanwhile=meanwhile)
            meanwhile = None
        single = len(rest) == 1 and len(ready) <= 1
        if single:
            await _execute(conn, statements.insert_job, _one(rest[0], channel, ready))
            announced = channel is not None
        for start in range(0, 0 if single else len(rest), INSERT_CHUNK):
            chunk = rest[start : start + INSERT_CHUNK]
            roots_now = all(_plain_root(j) for j in chunk)
            params = insert_params(
                chunk, channel=channel if start == 0 else None, ready=ready, plain=roots_now
            )
            query = statements.insert_plain_jobs if roots_now else statements.insert_jobs
            await _execute(conn, query, params)
            announced = channel is not None
    if meanwhile is not None:
        meanwhile()
    return announced


def plain_job_statement(
    statements: EnqueueStatements, job: NewJob, *, channel: str | None
) -> tuple[bytes, dict[str, Any]]:
    """The statement and parameters that insert one plain job (see ``is_plain``) and,
    with ``channel``, announce its queue on it.

    The commonest of them, a new chain's first job with no trace or logging context
    and no limit key, takes ``INSERT_PLAIN_ROOT``: eight parameters instead of
    fourteen and no result row; any other plain job ``INSERT_PLAIN_JOB``. The caller
    runs it (on ``start_chain``'s path every call between the caller's statements
    counts: this one is plain code, not a coroutine).
    """
    context = job.context
    trace = job.trace_context
    if (
        channel is not None
        and not context
        and not trace
        and job.limit_key is None
        and job.limit_group is None
        and job.chain_index == 0
        and (job.chain_id is job.id or job.chain_id == job.id)
        and job.chain_type_name == job.type_name
    ):
        return statements.insert_plain_root, {
            "id": job.id,
            "type_name": job.type_name,
            "input": job.input_json,
            "queue": job.queue,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "channel": channel,
            "ready": ready_notice(job.queue),
        }
    return statements.insert_plain_job, {
        "id": job.id,
        "type_name": job.type_name,
        "chain_id": job.chain_id,
        "chain_type_name": job.chain_type_name,
        "chain_index": job.chain_index,
        "input": job.input_json,
        "queue": job.queue,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "trace_context": json.dumps(dict(trace)) if trace else None,
        "context": json.dumps(dict(context)) if context else None,
        "limit_key": job.limit_key,
        "limit_group": job.limit_group,
        "channel": channel,
        "ready": ready_notice(job.queue) if channel is not None else None,
    }


@lru_cache(maxsize=256)
def ready_notice(queue: str) -> str:
    """The encoded ``ready`` notice of ``queue``: the same text every time, so that
    PostgreSQL folds a transaction's notices for one queue into one."""
    return encode_notice(Notice(kind="ready", queue=queue))


@dataclass(slots=True)
class Streamed:
    """What ``insert_streamed`` did: a result per job it took (``None`` for a job set
    aside), the jobs set aside in their order, and the queues of the rows written."""

    inserted: list[InsertedJob | None] = field(default_factory=list)
    aside: list[NewJob] = field(default_factory=list)
    queues: set[str] = field(default_factory=set)

    def take(self, chunk: list[NewJob]) -> list[NewJob]:
        """The plain jobs of ``chunk``, recording a result (or a set-aside) for each."""
        plain = []
        inserted, aside, queues = self.inserted, self.aside, self.queues
        pending = JobStatus.PENDING
        for job in chunk:
            if is_plain(job):
                plain.append(job)
                inserted.append(InsertedJob(job.id, job.chain_id, pending, False))
                queues.add(job.queue)
            else:
                aside.append(job)
                inserted.append(None)
        return plain


async def insert_streamed(
    conn: DbConn,
    statements: EnqueueStatements,
    schema: str,
    head: Sequence[NewJob],
    rest: Iterator[NewJob],
    *,
    channel: str | None,
    ready: Sequence[str],
) -> Streamed:
    """COPY ``head`` (plain jobs, at least ``COPY_MIN_ROWS``), then every plain job of
    ``rest`` as it is taken from the iterator; set the others aside.

    With ``channel``, ``ready`` (the queues of ``head``) is announced first; the
    caller announces the queues of later rows that are not in it.
    """
    streamed = Streamed()
    with translate_errors(schema):
        if channel is not None and ready:
            await _announce(conn, statements, channel, ready)
        await _copy(conn, statements, chain(head, rest), sort=streamed.take)
    return streamed


async def _copy(
    conn: DbConn,
    statements: EnqueueStatements,
    rows: Iterator[NewJob],
    *,
    sort: Callable[[list[NewJob]], list[NewJob]] | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> None:
    """COPY ``rows`` (through ``sort``, which picks those to write), a few hundred per
    write; ``meanwhile`` runs after the last write, while the server finishes."""
    if not isinstance(conn, psycopg.AsyncConnection):
        assert conn.copy is not None
        await conn.copy(statements.copy_jobs, _copy_chunks(rows, sort))
        if meanwhile is not None:
            meanwhile()
        return
    async with conn.cursor() as cur, cur.copy(statements.copy_jobs) as copy:
        for chunk in _copy_chunks(rows, sort):
            await copy.write(chunk)
        if meanwhile is not None:
            meanwhile()


def _copy_chunks(
    rows: Iterator[NewJob], sort: Callable[[list[NewJob]], list[NewJob]] | None
) -> Iterator[str]:
    """COPY text for ``rows`` (through ``sort``), a few hundred rows per chunk."""
    size = _COPY_FIRST_WRITE
    while chunk := list(islice(rows, size)):
        if sort is not None:
            chunk = sort(chunk)
        if chunk:
            yield _copy_lines(chunk)
        size = _COPY_ROWS_PER_WRITE


async def _announce(
    conn: DbConn, statements: EnqueueStatements, channel: str, ready: Sequence[str]
) -> None:
    await _execute(conn, statements.notify_ready, {"channel": channel, "ready": _encoded(ready)})


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
        "dedup_hold": dedup_hold(j),
        "trace_context": json.dumps(dict(j.trace_context)) if j.trace_context else None,
        "context": json.dumps(dict(j.context)) if j.context else None,
        "limit_key": j.limit_key,
        "limit_group": j.limit_group,
        "channel": channel,
        "ready": _encoded(ready)[0] if channel and ready else None,
    }


def _encoded(ready: Sequence[str]) -> list[str]:
    return [ready_notice(q) for q in ready]


async def _execute(conn: DbConn, query: bytes, params: dict[str, Any]) -> None:
    """Run one statement whose rows nobody reads.

    Not in pipeline mode: psycopg syncs right after the implicit ``BEGIN`` it queues,
    so a pipeline saves no round trip here and costs CPU.
    """
    await execute(conn, query, params)
