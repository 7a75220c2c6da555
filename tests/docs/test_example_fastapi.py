"""The FastAPI example's signup, as a browser would see it: once the response arrives,
the user row and its job are committed, so the next request (or a worker) finds them."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest
from examples.fastapi_app import create_app

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
