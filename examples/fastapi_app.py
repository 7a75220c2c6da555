"""FastAPI: enqueue a job in the same database transaction as the request's own writes.

The signup row and its welcome-email job commit together or not at all: if the request
fails after ``start_chain``, the session rolls back and no email goes out for a user
who does not exist. The endpoint commits before it returns, so the response is sent
only once both are committed (``request_session`` says why not later).

An approval flow: ``POST /expenses`` starts a chain whose second step waits for an
``approval`` signal (for three days at most); the approver's webhook, ``POST
/approvals/{id}``, records the decision and sends the signal in the request's own
transaction, so the step starts once, and only if, the decision is committed.
``GET /expenses/{id}`` says what the chain waits for, then how it ended.

The pgwork dashboard is mounted at ``/jobs`` (for requests from this machine only; put
your own authorization there). Serve it with any ASGI server (the app reads PGWORK_DSN
at startup):

    PGWORK_DSN=postgresql://localhost/app uvicorn examples.fastapi_app:app

``python examples/fastapi_app.py`` runs a signup and an approval through httpx's ASGI
transport and a worker in the same process, and prints what happened.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Annotated, Any, Literal
from uuid import UUID

import anyio
import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from pgwork import (
    Attempt,
    Client,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    TimedOut,
    create_client,
    create_in_process_worker,
)
from pgwork.dashboard import create_dashboard
from pgwork.errors import ChainNotFoundError


class Welcome(BaseModel):
    user_id: int
    email: str


class SignupIn(BaseModel):
    email: str


class ExpenseIn(BaseModel):
    who: str
    amount: int


class Expense(ExpenseIn):
    approve_within: timedelta


class Decision(BaseModel):
    approved: bool
    by: str


class Settled(BaseModel):
    outcome: Literal["approved", "rejected", "expired"]
    by: str | None = None


registry = JobTypeRegistry()
send_welcome = registry.job_type("fastapi.send_welcome", input=Welcome)
# The approver's decision, sent to "approval:<chain id>"; the step that settles an
# expense waits for it.
approval = registry.signal("approval", payload=Decision)
settle = registry.job_type(
    "fastapi.settle_expense", input=Expense, output=Settled, entry=False, waits_for=approval
)
ask_approval = registry.job_type("fastapi.ask_approval", input=Expense, continue_with=[settle])


def sqlalchemy_url(dsn: str) -> str:
    """pgwork adopts SQLAlchemy sessions that use the psycopg (3) driver."""
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    dsn = app.state.dsn or os.environ["PGWORK_DSN"]
    engine = create_async_engine(sqlalchemy_url(dsn))
    async with engine.begin() as conn:  # the application's own tables
        await conn.execute(
            text("CREATE TABLE IF NOT EXISTS users (id serial PRIMARY KEY, email text NOT NULL)")
        )
        await conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS decisions"
                " (expense uuid PRIMARY KEY, approved boolean NOT NULL, by text NOT NULL)"
            )
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


def create_app(dsn: str | None = None, approve_within: timedelta = timedelta(days=3)) -> FastAPI:
    app = FastAPI(lifespan=lifespan)
    app.state.dsn = dsn
    app.state.approve_within = approve_within
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

    @app.post("/expenses", status_code=201)
    async def submit_expense(body: ExpenseIn, request: Request, db: Session) -> dict[str, Any]:
        client: Client = request.app.state.client
        expense = Expense(**body.model_dump(), approve_within=request.app.state.approve_within)
        started = await client.start_chain(db, ask_approval, expense)
        await db.commit()
        return {"expense_id": str(started.id)}

    @app.post("/approvals/{expense_id}", status_code=202)
    async def approval_webhook(
        expense_id: UUID, body: Decision, request: Request, db: Session
    ) -> dict[str, Any]:
        """The approver's webhook: the decision row and the signal commit together."""
        client: Client = request.app.state.client
        try:
            await client.get_chain(expense_id)
        except ChainNotFoundError:
            raise HTTPException(404, "no such expense") from None
        await db.execute(
            text("INSERT INTO decisions VALUES (:id, :approved, :by)"),
            {"id": expense_id, **body.model_dump()},
        )
        await client.signal(db, approval, expense_id, body)
        await db.commit()
        return {"expense_id": str(expense_id)}

    @app.get("/expenses/{expense_id}")
    async def expense_status(expense_id: UUID, request: Request) -> dict[str, Any]:
        """Where the expense stands: what its chain waits for, or how it ended."""
        client: Client = request.app.state.client
        try:
            chain = await client.get_chain(expense_id)
        except ChainNotFoundError:
            raise HTTPException(404, "no such expense") from None
        waiting = await client.waiting(expense_id)
        return {
            "status": chain.status.value,
            "waiting_for": waiting.describe() if waiting is not None else None,
            "settled": chain.output.model_dump() if chain.output is not None else None,
        }

    return app


app = create_app()


async def send_welcome_email(attempt: Attempt[Welcome, Any]) -> None:
    print(f"welcome email to {attempt.job.input.email} (user {attempt.job.input.user_id})")


async def ask_for_approval(attempt: Attempt[Expense, Any]) -> Continue[Expense]:
    """Ask the approver (an email with a link, say), then hand on to the step that
    waits for the decision: it holds no worker slot while it waits."""
    expense = attempt.job.input
    wait = approval.named(attempt.job.chain_id, timeout=expense.approve_within)
    return Continue(settle, expense, wait_for=wait)


async def settle_expense(attempt: Attempt[Expense, Settled]) -> Settled:
    got = await attempt.received(approval)
    if isinstance(got, TimedOut):
        return Settled(outcome="expired")
    decision = got.payload
    return Settled(outcome="approved" if decision.approved else "rejected", by=decision.by)


PROCESSORS: dict[Any, Any] = {
    send_welcome: send_welcome_email,
    ask_approval: ask_for_approval,
    settle: settle_expense,
}


async def main(dsn: str) -> None:
    demo = create_app(dsn)
    async with demo.router.lifespan_context(demo):
        transport = httpx.ASGITransport(app=demo)
        # The dashboard answers only this machine's names (see create_dashboard).
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            response = await http.post("/signups", json={"email": "grace@example.com"})
            print(f"POST /signups -> {response.status_code} {response.json()}")
            client: Client = demo.state.client
            worker = create_in_process_worker(client=client, processors=PROCESSORS)
            async with worker:
                chain_id = response.json()["job_id"]
                await client.await_chain(UUID(chain_id), timeout=30)
                print("job completed")
                expense = (await http.post("/expenses", json={"who": "ada", "amount": 120})).json()
                expense_id = expense["expense_id"]
                for _ in range(600):  # until its first step has handed on (milliseconds)
                    status = (await http.get(f"/expenses/{expense_id}")).json()
                    if status["waiting_for"] is not None:
                        break
                    await anyio.sleep(0.05)
                print(f"GET /expenses/{{id}} -> waiting for {status['waiting_for']}")
                decided = await http.post(
                    f"/approvals/{expense_id}", json={"approved": True, "by": "grace"}
                )
                print(f"POST /approvals/{{id}} -> {decided.status_code}")
                settled = await client.await_chain(UUID(expense_id), timeout=30)
                print(f"expense {settled.outcome} by {settled.by}")
            page = await http.get(f"/jobs/chains/{chain_id}")
            print(
                f"GET /jobs/chains/{{id}} -> {page.status_code}, shows 'completed': "
                f"{'status-completed' in page.text}"
            )


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
