"""FastAPI: enqueue a job in the same database transaction as the request's own writes.

The signup row and its welcome-email job commit together or not at all: if the request
fails after ``start_chain``, the session rolls back and no email goes out for a user
who does not exist. The endpoint commits before it returns, so the response is sent
only once both are committed (``request_session`` says why not later). The pgwork
dashboard is mounted at ``/jobs`` (for requests from this machine only; put your own
authorization there). Serve it with any ASGI server (the app reads PGWORK_DSN at
startup):

    PGWORK_DSN=postgresql://localhost/app uvicorn examples.fastapi_app:app

``python examples/fastapi_app.py`` runs one request through httpx's ASGI transport and a
worker in the same process, and prints what happened.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any
from uuid import UUID

import anyio
import httpx
from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from pgwork import (
    Attempt,
    Client,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.dashboard import create_dashboard


class Welcome(BaseModel):
    user_id: int
    email: str


class SignupIn(BaseModel):
    email: str


registry = JobTypeRegistry()
send_welcome = registry.job_type("fastapi.send_welcome", input=Welcome)


def sqlalchemy_url(dsn: str) -> str:
    """pgwork adopts SQLAlchemy sessions that use the psycopg (3) driver."""
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    dsn = app.state.dsn or os.environ["PGWORK_DSN"]
    engine = create_async_engine(sqlalchemy_url(dsn))
    async with engine.begin() as conn:  # the application's own table
        await conn.execute(
            text("CREATE TABLE IF NOT EXISTS users (id serial PRIMARY KEY, email text NOT NULL)")
        )
    state = await PostgresStateAdapter.connect(dsn)
    app.state.client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=registry
    )
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    try:
        yield
    finally:
        await app.state.client.close()
        await engine.dispose()


async def request_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One session (one transaction) per request; the endpoint commits it itself.

    FastAPI runs a dependency's code after ``yield`` once the response has been sent,
    so a commit there (``session.begin()`` around the ``yield``) would tell the client
    "created" before the user and the job exist for anyone else: a next request, or a
    worker, would not find them yet, and a commit that then failed could no longer
    change the answer. Whatever the endpoint did not commit is rolled back when the
    session closes here (an endpoint that raised, for instance)."""
    async with request.app.state.sessions() as session:
        yield session


Session = Annotated[AsyncSession, Depends(request_session)]


FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def local_only(request: Request) -> bool:
    """Who may use the dashboard: here, requests from this machine. In an application,
    check its own session or credentials (the function may be async).

    A request that came through a proxy is refused whatever address it claims: behind
    ``--forwarded-allow-ips`` the server takes the client's address from
    ``X-Forwarded-For``, which whoever talks to the proxy writes. (The dashboard
    itself refuses a ``Host`` other than this machine's names, so a web page that
    rebinds its own name to 127.0.0.1 gets nothing either.)"""
    if any(name in request.headers for name in FORWARDING_HEADERS):
        return False
    return request.client is not None and request.client.host in ("127.0.0.1", "::1")


def create_app(dsn: str | None = None) -> FastAPI:
    app = FastAPI(lifespan=lifespan)
    app.state.dsn = dsn
    # The client exists once the lifespan has started: hand the dashboard a getter.
    app.mount("/jobs", create_dashboard(lambda: app.state.client, authorize=local_only))

    @app.post("/signups", status_code=201)
    async def signup(body: SignupIn, request: Request, db: Session) -> dict[str, Any]:
        client: Client = request.app.state.client
        user_id = (
            await db.execute(
                text("INSERT INTO users (email) VALUES (:email) RETURNING id"),
                {"email": body.email},
            )
        ).scalar_one()
        started = await client.start_chain(
            db, send_welcome, Welcome(user_id=user_id, email=body.email)
        )
        # The user and the job commit together, and before the response is sent (see
        # request_session): a client that saw 201 finds both.
        await db.commit()
        return {"user_id": user_id, "job_id": str(started.job_id)}

    return app


app = create_app()


async def send_welcome_email(attempt: Attempt[Welcome, Any]) -> None:
    print(f"welcome email to {attempt.job.input.email} (user {attempt.job.input.user_id})")


async def main(dsn: str) -> None:
    demo = create_app(dsn)
    async with demo.router.lifespan_context(demo):
        transport = httpx.ASGITransport(app=demo)
        # The dashboard answers only this machine's names (see create_dashboard).
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            response = await http.post("/signups", json={"email": "grace@example.com"})
            print(f"POST /signups -> {response.status_code} {response.json()}")
            client: Client = demo.state.client
            worker = create_in_process_worker(
                client=client, processors={send_welcome: send_welcome_email}
            )
            async with worker:
                chain_id = response.json()["job_id"]
                await client.await_chain(UUID(chain_id), timeout=30)
            print("job completed")
            page = await http.get(f"/jobs/chains/{chain_id}")
            print(
                f"GET /jobs/chains/{{id}} -> {page.status_code}, shows 'completed': "
                f"{'status-completed' in page.text}"
            )


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
