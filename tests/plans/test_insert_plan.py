"""The batch inserts unnest their arrays in a select list, not in FROM.

``INSERT_JOBS`` and ``INSERT_PLAIN_JOBS`` take one array per column. Unnested in FROM
(``FROM unnest(a, b, ...)``) they become a Function Scan, which copies every row into
a tuplestore before the insert reads the first; unnested in a select list they become
a ProjectSet, which hands each row on as it makes it: the same rows, in lockstep, for
less server CPU per row (`python -m bench --only enqueue` measures it).
This pins the plan; the rows themselves are held to the other paths' by
``tests/engine/test_enqueue_paths.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgwork.adapters.state import NewJob
from pgwork.postgres._enqueue import insert_params
from pgwork.postgres.sql import render


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _jobs(*, plain: bool) -> list[NewJob]:
    jobs = []
    for n in range(3):
        job_id = uuid.uuid4()
        jobs.append(
            NewJob(
                id=job_id,
                type_name="work",
                chain_id=job_id,
                chain_type_name="work",
                chain_index=0,
                input_json=json.dumps({"n": n}),
                queue="default",
                priority=0,
                max_attempts=3,
                run_after=None if plain else timedelta(seconds=5),
            )
        )
    return jobs


def _insert_nodes(dsn: str, query: bytes, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan nodes of the insert itself (the CTE), without the notice's SELECT."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(b"EXPLAIN (FORMAT JSON) " + query, params).fetchone()
        conn.rollback()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    inserts = [n for n in _nodes(document[0]["Plan"]) if n["Node Type"] == "ModifyTable"]
    assert len(inserts) == 1, document
    return list(_nodes(inserts[0]))


@pytest.mark.parametrize("plain", [True, False], ids=["INSERT_PLAIN_JOBS", "INSERT_JOBS"])
def test_a_batch_insert_unnests_its_arrays_as_it_inserts(pgwork_dsn: str, plain: bool) -> None:
    statements = render("pgwork").enqueue
    query = statements.insert_plain_jobs if plain else statements.insert_jobs
    params = insert_params(
        _jobs(plain=plain), channel="pgwork_events", ready=["default"], plain=plain
    )
    nodes = _insert_nodes(pgwork_dsn, query, params)
    kinds = [n["Node Type"] for n in nodes]
    assert "ProjectSet" in kinds, kinds
    assert "Function Scan" not in kinds, kinds
