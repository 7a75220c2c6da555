"""Quickstart: declare a job type, enqueue it in a transaction, and run a worker.

Run it against a migrated database (``pgwork migrate --dsn ...`` once):

    PGWORK_DSN=postgresql://localhost/app python examples/quickstart.py

or run only its worker, the way you would in production:

    pgwork worker examples.quickstart:worker --dsn postgresql://localhost/app --slots 4
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta

import anyio
import psycopg
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Client,
    InProcessWorker,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    RetryPolicy,
    create_client,
    create_in_process_worker,
)


class SendWelcome(BaseModel):
    user_id: int
    email: str


class Sent(BaseModel):
    message_id: str


registry = JobTypeRegistry()
send_welcome = registry.job_type(
    "send_welcome",
    input=SendWelcome,
    output=Sent,
    max_attempts=3,
    retry=RetryPolicy(initial=timedelta(seconds=1)),
)


async def send_welcome_email(attempt: Attempt[SendWelcome, Sent]) -> Sent:
    """The handler: its return value completes the job (raising would retry it)."""
    email = attempt.job.input.email
    print(f"sending a welcome email to {email} (attempt {attempt.job.attempt})")
    return Sent(message_id=f"msg-{attempt.job.input.user_id}")


async def connect_client(dsn: str) -> Client:
    state = await PostgresStateAdapter.connect(dsn)
    return create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=registry
    )


async def worker(
    dsn: str,
    max_slots: int = 10,
    queues: Sequence[str] | None = None,
    poll_interval: float = 2.0,
) -> InProcessWorker:
    """What ``pgwork worker examples.quickstart:worker`` runs (it passes --dsn, --slots,
    --queues and --poll-interval by these names, and closes the client at the end)."""
    client = await connect_client(dsn)
    return create_in_process_worker(
        client=client,
        processors={send_welcome: send_welcome_email},
        max_slots=max_slots,
        queues=queues,
        poll_interval=poll_interval,
    )


async def main(dsn: str) -> None:
    client = await connect_client(dsn)
    try:
        # Enqueue inside your own transaction: the job exists only if this commits.
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            started = await client.start_chain(
                conn, send_welcome, SendWelcome(user_id=1, email="ada@example.com")
            )
            await conn.commit()

        run = create_in_process_worker(client=client, processors={send_welcome: send_welcome_email})
        async with run:  # starts the worker; leaving the block stops it gracefully
            output = await client.await_chain(started.id, timeout=30)
        print(f"chain completed: {output!r}")
    finally:
        await client.close()


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
