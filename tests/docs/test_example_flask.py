"""The Flask example's signup through Flask's test client, and its job run by the
example's worker in this process: the row and the job commit together or not at all,
and the plain ``def`` handler runs on a worker thread, writing through its own session."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
import pytest
from examples.flask_app import create_app, make_worker


def committed(dsn: str, email: str) -> tuple[int, int]:
    """(signups, jobs) for ``email`` as another connection sees them: committed rows only."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM signups WHERE email = %(e)s),"
            " (SELECT count(*) FROM pgwork.jobs WHERE input->>'email' = %(e)s)",
            {"e": email},
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def welcomed_at(dsn: str, signup_id: int) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT welcomed_at FROM signups WHERE id = %s", [signup_id]).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_signup_commits_with_its_job_which_a_sync_handler_runs(pgwork_dsn: str) -> None:
    http = create_app(pgwork_dsn).test_client()

    response = http.post("/signups", json={"email": "ada@example.com"})

    assert response.status_code == 201, response.text
    assert committed(pgwork_dsn, "ada@example.com") == (1, 1)
    signup_id, job_id = response.json["signup_id"], UUID(response.json["job_id"])
    assert welcomed_at(pgwork_dsn, signup_id) is None

    worker = await make_worker(pgwork_dsn)
    try:
        async with worker:
            sent = await worker.client.await_chain(job_id, timeout=30)
    finally:
        await worker.client.close()

    assert sent.startswith("welcome email to ada@example.com, sent from pgwork-sync-")
    assert welcomed_at(pgwork_dsn, signup_id) is not None  # the handler's own commit


@pytest.mark.timeout(60)
def test_a_request_that_fails_after_enqueueing_commits_neither_row_nor_job(
    pgwork_dsn: str,
) -> None:
    http = create_app(pgwork_dsn).test_client()

    declined = http.post("/signups", json={"email": "eve@example.com", "card": "declined"})

    assert declined.status_code == 402, declined.text
    assert committed(pgwork_dsn, "eve@example.com") == (0, 0)
    # Nothing of the failed request holds on: the same email signs up on the next one.
    again = http.post("/signups", json={"email": "eve@example.com"})
    assert again.status_code == 201, again.text
    assert committed(pgwork_dsn, "eve@example.com") == (1, 1)
