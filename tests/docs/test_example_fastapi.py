"""The FastAPI example's signup, as a browser would see it: once the response arrives,
the user row and its job are committed, so the next request (or a worker) finds them.
And its approval flow: an expense's chain waits for the approver's webhook, or for its
timeout."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import anyio
import httpx
import psycopg
import pytest
from examples.fastapi_app import PROCESSORS, create_app

from pgwork import Client, create_in_process_worker

pytestmark = pytest.mark.anyio

Scope = dict[str, Any]
Message = dict[str, Any]


async def committed(dsn: str, email: str) -> tuple[int, int]:
    """(users, jobs) for ``email`` as another connection sees them: committed rows only."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM users WHERE email = %(e)s),"
            " (SELECT count(*) FROM pgwork.jobs WHERE input->>'email' = %(e)s)",
            {"e": email},
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.timeout(60)
async def test_signup_is_committed_when_its_response_starts(pgwork_dsn: str) -> None:
    """Checked at the moment the app sends the response's first message, from another
    connection. A dependency's code after ``yield`` (where a ``session.begin()`` block
    would commit) runs only after the response is sent, so without the endpoint's own
    commit the row and the job are not there yet."""
    app = create_app(pgwork_dsn)
    seen: list[tuple[int, int]] = []

    async def watched(scope: Scope, receive: Any, send: Any) -> None:
        async def send_and_look(message: Message) -> None:
            if message["type"] == "http.response.start" and scope["path"] == "/signups":
                seen.append(await committed(pgwork_dsn, "lin@example.com"))
            await send(message)

        await app(scope, receive, send_and_look)

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=watched)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            response = await http.post("/signups", json={"email": "lin@example.com"})

    assert response.status_code == 201, response.text
    assert seen == [(1, 1)]


# --- the approval flow ----------------------------------------------------------------


@asynccontextmanager
async def _served(
    dsn: str, approve_within: timedelta = timedelta(days=3)
) -> AsyncIterator[tuple[httpx.AsyncClient, Client]]:
    """The app with a worker running its job types, and an HTTP client to it."""
    app = create_app(dsn, approve_within=approve_within)
    async with app.router.lifespan_context(app):
        client: Client = app.state.client
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://app") as http,
            create_in_process_worker(client=client, processors=PROCESSORS),
        ):
            yield http, client


async def _submitted(http: httpx.AsyncClient, client: Client) -> str:
    """An expense submitted, once its chain waits for the approval."""
    response = await http.post("/expenses", json={"who": "ada", "amount": 120})
    assert response.status_code == 201, response.text
    expense_id: str = response.json()["expense_id"]
    with anyio.fail_after(20):
        while await client.waiting(UUID(expense_id)) is None:
            await anyio.sleep(0.02)  # its first step hands on within milliseconds
            assert (await client.get_chain(UUID(expense_id))).status.value == "active"
    return expense_id


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("approved", "outcome"), [(True, "approved"), (False, "rejected")])
async def test_the_approval_webhook_settles_the_waiting_expense(
    pgwork_dsn: str, approved: bool, outcome: str
) -> None:
    async with _served(pgwork_dsn) as (http, client):
        expense_id = await _submitted(http, client)
        status = (await http.get(f"/expenses/{expense_id}")).json()
        assert status["status"] == "active"
        assert status["waiting_for"] == f"signal 'approval:{expense_id}' (timeout in 2d 23h)"

        decided = await http.post(
            f"/approvals/{expense_id}", json={"approved": approved, "by": "grace"}
        )
        assert decided.status_code == 202, decided.text
        settled = await client.await_chain(UUID(expense_id), timeout=30)

        assert (settled.outcome, settled.by) == (outcome, "grace")
        status = (await http.get(f"/expenses/{expense_id}")).json()
    assert status == {
        "status": "completed",
        "waiting_for": None,
        "settled": {"outcome": outcome, "by": "grace"},
    }
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT approved, by FROM decisions")
        assert await cur.fetchall() == [(approved, "grace")]


@pytest.mark.timeout(60)
async def test_an_expense_nobody_decides_on_expires_at_its_timeout(pgwork_dsn: str) -> None:
    async with _served(pgwork_dsn, approve_within=timedelta(seconds=1)) as (http, client):
        expense_id = await _submitted(http, client)
        settled = await client.await_chain(UUID(expense_id), timeout=30)
        assert (settled.outcome, settled.by) == ("expired", None)
        # Too late: the decision is recorded, and its signal kept for no one.
        late = await http.post(f"/approvals/{expense_id}", json={"approved": True, "by": "x"})
        assert late.status_code == 202
        assert [s.name for s in (await client.list_signals()).items] == [f"approval:{expense_id}"]


@pytest.mark.timeout(60)
async def test_a_failed_webhook_request_sends_no_signal(pgwork_dsn: str) -> None:
    """A decision for an expense that does not exist is refused, and nothing of the
    request is committed: no decision, no signal."""
    async with _served(pgwork_dsn) as (http, client):
        missing = await http.post(f"/approvals/{uuid4()}", json={"approved": True, "by": "x"})
        assert missing.status_code == 404
        assert (await client.list_signals(pending=False)).items == ()
