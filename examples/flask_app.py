"""Flask: enqueue a job in the same transaction as the view's own write, and run it in a
plain ``def`` handler.

The view writes the signup and its welcome job on the request's SQLAlchemy session, and
commits both before it returns. A request that fails before the commit leaves neither:
the session is closed when the request ends, and with it the transaction rolls back.
No event loop is needed: ``client.start_chain_sync`` writes on the session's own
connection, and the worker runs the job in a plain ``def`` on a thread of its own, where
blocking calls are fine. Serve the app and run the worker (both need PGWORK_DSN):

    PGWORK_DSN=postgresql://localhost/app flask --app examples.flask_app run
    pgwork worker examples.flask_app:make_worker --dsn postgresql://localhost/app

``python examples/flask_app.py`` sends two requests through Flask's test client, runs
the worker in the same process, and prints what happened.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime
from typing import Any
from uuid import UUID

import anyio
import sqlalchemy as sa
from flask import Flask, g, request
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from pgwork import (
    InProcessWorker,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    SyncAttempt,
    create_client,
    create_in_process_worker,
)


class Base(DeclarativeBase):
    pass


class Signup(Base):
    __tablename__ = "signups"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(unique=True)
    welcomed_at: Mapped[datetime | None]  # set by the job


class Welcome(BaseModel):
    signup_id: int
    email: str


registry = JobTypeRegistry()
send_welcome = registry.job_type("flask.send_welcome", input=Welcome, output=str)


def sessions_for(dsn: str) -> sessionmaker[Session]:
    """Sessions on the psycopg (3) driver, the one pgwork adopts."""
    engine = sa.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    Base.metadata.create_all(engine)  # the app's table; an Alembic migration in an app
    return sessionmaker(engine, expire_on_commit=False)


class PaymentDeclined(Exception):
    pass


def charge_first_month(email: str, card: str) -> None:
    """Stands in for a payment provider's API, which declines the card "declined"."""
    if card == "declined":
        raise PaymentDeclined(f"the card of {email} was declined")


def create_app(dsn: str | None = None) -> Flask:
    dsn = dsn or os.environ["PGWORK_DSN"]
    app = Flask(__name__)
    sessions = sessions_for(dsn)
    # Built once, without an event loop: start_chain_sync writes on the caller's
    # connection, so the adapter's pool is never opened.
    client = create_client(
        state_adapter=PostgresStateAdapter(AsyncConnectionPool(dsn, open=False)),
        notify_adapter=PostgresNotifyAdapter(dsn),  # wakes the workers on commit
        registry=registry,
    )

    def db() -> Session:
        """The request's session: one transaction, which the view commits."""
        if "db" not in g:
            g.db = sessions()
        return g.db

    @app.teardown_appcontext
    def close_db(error: BaseException | None) -> None:
        """Closing the session rolls back whatever the view did not commit."""
        session = g.pop("db", None)
        if session is not None:
            session.close()

    @app.post("/signups")
    def signup() -> tuple[dict[str, Any], int]:
        body = request.get_json()
        session = db()
        new = Signup(email=body["email"])
        session.add(new)
        session.flush()  # the INSERT, for new.id
        started = client.start_chain_sync(
            session, send_welcome, Welcome(signup_id=new.id, email=new.email)
        )
        charge_first_month(new.email, body.get("card", ""))  # may raise: nothing commits
        # The signup and its job commit together, before the response is sent: a client
        # that saw 201 finds both, and so does a worker.
        session.commit()
        return {"signup_id": new.id, "job_id": str(started.job_id)}, 201

    @app.errorhandler(PaymentDeclined)
    def declined(error: PaymentDeclined) -> tuple[dict[str, Any], int]:
        return {"error": str(error)}, 402

    return app


async def make_worker(dsn: str, max_slots: int = 10) -> InProcessWorker:
    """The worker ``pgwork worker examples.flask_app:make_worker`` runs."""
    sessions = sessions_for(dsn)

    def send_welcome_email(attempt: SyncAttempt[Welcome, str]) -> str:
        """A plain ``def``: it runs on one of the worker's threads, so it may block, as
        the rest of a Flask application does (smtplib, requests, a SQLAlchemy session)."""
        welcome = attempt.job.input
        # smtplib.SMTP("localhost").send_message(...) goes here.
        with sessions.begin() as session:  # commits when the block ends
            session.get_one(Signup, welcome.signup_id).welcomed_at = sa.func.now()
        return f"welcome email to {welcome.email}, sent from {threading.current_thread().name}"

    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=registry,
    )
    return create_in_process_worker(
        client=client, processors={send_welcome: send_welcome_email}, max_slots=max_slots
    )


async def main(dsn: str) -> None:
    http = create_app(dsn).test_client()
    created = http.post("/signups", json={"email": "grace@example.com"})
    print(f"POST /signups -> {created.status_code} {created.json}")
    declined = http.post("/signups", json={"email": "eve@example.com", "card": "declined"})
    print(f"POST /signups with a declined card -> {declined.status_code} {declined.json}")

    worker = await make_worker(dsn)
    try:
        async with worker:
            sent = await worker.client.await_chain(UUID(created.json["job_id"]), timeout=30)
        print(sent)
    finally:
        await worker.client.close()


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
