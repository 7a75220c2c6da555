"""Scheduling: run later, run now, and run on a cron schedule exactly once per tick.

* ``schedule=timedelta(...)`` / an aware datetime delays a job (past times run now);
* ``client.trigger(tx, [job_id])`` makes a delayed job due at once;
* ``CronSchedule`` handed to workers enqueues a chain on every tick — however many
  workers carry it, each tick is enqueued once (deduplicated in the database).

    PGWORK_DSN=postgresql://localhost/app python examples/scheduling.py
"""

from __future__ import annotations

import os
from datetime import timedelta

import anyio
import psycopg
from pydantic import BaseModel

from pgwork import (
    Attempt,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.schedules import CronSchedule


class Reminder(BaseModel):
    text: str


class Digest(BaseModel):
    audience: str


registry = JobTypeRegistry()
remind = registry.job_type("remind", input=Reminder, output=str)
send_digest = registry.job_type("send_digest", input=Digest, output=str)

# Every minute (five fields: minute hour day-of-month month day-of-week, UTC by default).
every_minute = CronSchedule("digest-every-minute", "* * * * *", send_digest, Digest(audience="ops"))


async def main(dsn: str) -> list[str]:
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=registry,
    )
    ran: list[str] = []
    digest_sent = anyio.Event()

    async def handle_remind(attempt: Attempt[Reminder, str]) -> str:
        ran.append(attempt.job.input.text)
        return "reminded"

    async def handle_digest(attempt: Attempt[Digest, str]) -> str:
        ran.append(f"digest for {attempt.job.input.audience}")
        digest_sent.set()
        return "sent"

    processors = {remind: handle_remind, send_digest: handle_digest}
    # Two workers carrying the same schedule, as two processes would.
    first = create_in_process_worker(client=client, processors=processors, schedules=[every_minute])
    second = create_in_process_worker(
        client=client, processors=processors, schedules=[every_minute]
    )
    try:
        async with first, second:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                later = await client.start_chain(
                    conn, remind, Reminder(text="tomorrow"), schedule=timedelta(days=1)
                )
                await conn.commit()
                # Changed our mind: run it now.
                await client.trigger(conn, [later.job_id])
                await conn.commit()
            assert await client.await_chain(later.id, timeout=30) == "reminded"
            with anyio.fail_after(30):
                await digest_sent.wait()
        print(ran)
        return ran
    finally:
        await client.close()


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
