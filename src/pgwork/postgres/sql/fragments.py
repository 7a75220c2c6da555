"""SQL fragments several statements share: a job's columns, chain membership, a
chain's newest job, a job's first blocker edges, an attempt appended to a job's
history.

Each returns template text (``{jobs}`` still to fill, see ``pgwork.postgres.sql``).
"""

from __future__ import annotations

from pgwork.records import ATTEMPT_HISTORY_LIMIT, HISTORY_TRACEBACK_LIMIT

__all__ = ["appended_history", "first_edges", "in_chain", "job_columns", "last_job"]

# Columns of a full job row, in the order ``_rows.job_from_row`` reads them. Input and
# output come as text and are parsed row by row (``_rows.parse_stored_json``).
_JOB_COLUMNS = """
    {alias}.id, {alias}.type_name, {alias}.chain_id, {alias}.chain_type_name,
    {alias}.chain_index, {alias}.input::text, {alias}.output::text, {alias}.status::text,
    {alias}.queue, {alias}.priority, {alias}.created_at, {alias}.scheduled_at,
    {alias}.started_at, {alias}.completed_at, {alias}.attempt, {alias}.max_attempts,
    {alias}.last_attempt_error, {alias}.last_attempt_at, {alias}.leased_by,
    {alias}.leased_until, {alias}.dedup_key, {alias}.context, {alias}.attempt_history::text,
    {alias}.limit_key, {alias}.debounce_deadline
"""


def job_columns(alias: str) -> str:
    return _JOB_COLUMNS.replace("{alias}", alias)


def in_chain(alias: str, chain: str) -> str:
    """SQL: job ``alias`` belongs to the chain(s) ``chain`` (``%(x)s``, ``ANY(...)``).

    ``jobs_chain_idx`` holds continuations only (migration 0005), so the root is matched
    apart, by primary key; the planner reads the two indexes and ORs the results.
    """
    return (
        f"(({alias}.id = {chain} AND {alias}.id = {alias}.chain_id)"
        f" OR ({alias}.chain_id = {chain} AND {alias}.id <> {alias}.chain_id))"
    )


def first_edges(job: str, limit: str) -> str:
    """SQL: a subquery of job ``job``'s first ``limit`` blocker edges (its blocker
    chain and position), in declaration order: one range of job_blockers_position_idx,
    however many chains the job waits for."""
    return f"""(
    SELECT b.blocker_chain_id, b.position
    FROM {{job_blockers}} AS b
    WHERE b.job_id = {job}.id
    ORDER BY b.position
    LIMIT {limit}
)"""


def last_job(root: str) -> str:
    """SQL: the newest job (a whole row) of the chain whose root row is ``root``, an
    alias in scope: its last continuation (``jobs_chain_idx``, which holds
    continuations only), else the root itself. No row when ``root`` is NULL."""
    return f"""(
        SELECT n.* FROM (
            (SELECT c.* FROM {{jobs}} AS c
             WHERE c.chain_id = {root}.id AND c.id <> c.chain_id
             ORDER BY c.chain_index DESC
             LIMIT 1)
            UNION ALL
            SELECT {root}.* WHERE {root}.id IS NOT NULL
        ) AS n
        ORDER BY n.chain_index DESC
        LIMIT 1
    )"""


def appended_history(alias: str, ran_for: str, error: str) -> str:
    """SQL: job ``alias``'s attempt history with its current attempt appended, failed
    with ``error`` (jsonb) after ``ran_for`` seconds (NULL: unknown), and cut to the
    newest ``ATTEMPT_HISTORY_LIMIT`` entries. The entry's traceback keeps its last
    ``HISTORY_TRACEBACK_LIMIT`` characters; its time is UTC, written the same way
    whatever the session's time zone."""
    keep = HISTORY_TRACEBACK_LIMIT
    history = f"""COALESCE({alias}.attempt_history, '[]'::jsonb) || jsonb_build_array(
            jsonb_build_object(
                'attempt', {alias}.attempt,
                'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                'worker', {alias}.leased_by,
                'ran_for', {ran_for},
                'error', {error} || jsonb_build_object('traceback',
                    CASE WHEN length({error} ->> 'traceback') > {keep}
                         THEN '…' || right({error} ->> 'traceback', {keep})
                         ELSE {error} ->> 'traceback' END)))"""
    return f"""jsonb_path_query_array(
            {history},
            '$[$from to last]',
            jsonb_build_object('from', GREATEST(
                COALESCE(jsonb_array_length({alias}.attempt_history), 0)
                + 1 - {ATTEMPT_HISTORY_LIMIT}, 0)))"""
