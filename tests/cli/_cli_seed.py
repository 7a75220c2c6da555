"""Jobs in every state the operator commands show, made through the public API.

A two-step chain that completed, a job that failed for good with a traceback, a job
blocked on a chain still pending, ready and scheduled mail that no worker serves. The
commands under test then read them with an empty job-type registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.errors import ChainFailedError


class Page(BaseModel):
    url: str


class Parsed(BaseModel):
    words: int


class Mail(BaseModel):
    to: str


@dataclass(frozen=True)
class Seeded:
    fetch_chain: UUID  # completed: fetch -> parse
    parse_job: UUID
    failed_job: UUID  # explode, failed for good on its only attempt
    mail_jobs: tuple[UUID, ...]  # ready in queue "mail", oldest first
    scheduled_job: UUID  # in queue "mail", due in an hour
    blocked_job: UUID  # waits for mail_jobs[0]'s chain


registry = JobTypeRegistry()
fetch = registry.job_type("fetch", input=Page, output=Parsed, continue_with=["parse"])
parse = registry.job_type("parse", input=Page, output=Parsed, entry=False)
explode = registry.job_type("explode", input=Page, max_attempts=1)
send_mail = registry.job_type("send_mail", input=Mail, queue="mail")
digest = registry.job_type("digest", input=Mail, queue="mail")


async def _fetch(attempt: Attempt[Page, Parsed]) -> Continue[Page]:
    return Continue(parse, attempt.job.input)


async def _parse(attempt: Attempt[Page, Parsed]) -> Parsed:
    return Parsed(words=len(attempt.job.input.url))


async def _explode(attempt: Attempt[Page, None]) -> None:
    raise ValueError(f"cannot fetch {attempt.job.input.url}")


async def _seed(dsn: str) -> Seeded:
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=registry,
        observers=[],
    )
    worker = create_in_process_worker(
        client=client,
        processors={fetch: _fetch, parse: _parse, explode: _explode},
        poll_interval=0.2,
        observers=[],
    )
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            chain = await client.start_chain(conn, fetch, Page(url="https://example.org"))
            failed = await client.start_chain(conn, explode, Page(url="https://bad.example"))
            await conn.commit()
        await worker.start()
        await client.await_chain(chain.id, timeout=30)
        with pytest.raises(ChainFailedError):
            await client.await_chain(failed.id, timeout=30)
        await worker.stop()
        mail = []
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            for to in ("a@example.org", "b@example.org", "c@example.org"):
                mail.append(await client.start_chain(conn, send_mail, Mail(to=to)))
                await conn.commit()  # one transaction each: distinct created_at
            later = await client.start_chain(
                conn, send_mail, Mail(to="later@example.org"), schedule=timedelta(hours=1)
            )
            blocked = await client.start_chain(
                conn, digest, Mail(to="d@example.org"), blockers=[mail[0]]
            )
            await conn.commit()
        jobs = await client.list_chain_jobs(chain.id)
        return Seeded(
            fetch_chain=chain.id,
            parse_job=jobs[1].id,
            failed_job=failed.job_id,
            mail_jobs=tuple(m.job_id for m in mail),
            scheduled_job=later.job_id,
            blocked_job=blocked.job_id,
        )
    finally:
        with anyio.CancelScope(shield=True):
            await worker.stop()
            await client.close()


def seed(dsn: str) -> Seeded:
    """Fill ``dsn``'s pgwork schema (blocking: the CLI under test runs its own loop)."""
    return anyio.run(_seed, dsn)
