"""What the dashboard tests share: a registry, seeding through the public client, and a
worker run until the database says it is done."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio
import httpx
import psycopg
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Client,
    JobTypeRegistry,
    Rate,
    StartedChain,
    create_in_process_worker,
)
from pgwork.backoff import RetryPolicy
from pgwork.records import JobStatus


class Note(BaseModel):
    text: str


class Order(BaseModel):
    user_id: int | str
    email: str = ""


registry = JobTypeRegistry()
echo = registry.job_type("dash.echo", input=Note, output=Note)
breaks = registry.job_type("dash.breaks", input=Note, max_attempts=1)
mail = registry.job_type("dash.mail", input=Note, queue="mail")
waits = registry.job_type("dash.waits", input=Note, queue="merge")
slow = registry.job_type("dash.slow", input=Note, queue="slow")
flaky = registry.job_type("dash.flaky", input=Note, max_attempts=1)
orders = registry.job_type("dash.orders", input=Order, queue="orders")
# Limited: three at once, one per tenant.
tenant = registry.job_type(
    "dash.tenant", input=Note, queue="tenants", concurrency=3, key_concurrency=1
)
# Rated: ten an hour in all, two an hour per key (nothing leaves its window in a test).
metered = registry.job_type(
    "dash.metered",
    input=Note,
    queue="metered",
    rate=Rate(10, per=timedelta(hours=1)),
    key_rate=Rate(2, per=timedelta(hours=1)),
)
# Fails each attempt with its number, retried at once, three attempts in all.
retries = registry.job_type(
    "dash.retries",
    input=Note,
    max_attempts=3,
    retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
)

# dash.flaky fails while this is set; a test clears it before retrying.
FLAKY_FAILS = {"on": True}
# dash.slow's attempts: started, then cancelled (set by the handler itself).
SLOW_EVENTS: dict[str, anyio.Event] = {}


async def handle_echo(attempt: Attempt[Note, Note]) -> Note:
    return Note(text=attempt.job.input.text.upper())


async def handle_breaks(attempt: Attempt[Note, Any]) -> None:
    raise RuntimeError(attempt.job.input.text)


async def handle_plain(attempt: Attempt[Note, Any]) -> None:
    return None


async def handle_flaky(attempt: Attempt[Note, Any]) -> None:
    if FLAKY_FAILS["on"]:
        raise RuntimeError(f"flaky: {attempt.job.input.text}")


async def handle_retries(attempt: Attempt[Note, Any]) -> None:
    raise KeyError(f"{attempt.job.input.text} #{attempt.job.attempt}")


async def handle_slow(attempt: Attempt[Note, Any]) -> None:
    """Runs until cancelled, and says so."""
    SLOW_EVENTS.setdefault("started", anyio.Event()).set()
    try:
        await anyio.sleep_forever()
    finally:
        SLOW_EVENTS.setdefault("cancelled", anyio.Event()).set()


PROCESSORS: dict[Any, Any] = {
    flaky: handle_flaky,
    retries: handle_retries,
    slow: handle_slow,
    echo: handle_echo,
    breaks: handle_breaks,
    mail: handle_plain,
    waits: handle_plain,
}


async def start(
    client: Client, dsn: str, job_type: Any, text: str, **options: Any
) -> StartedChain[Any, Any]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started = await client.start_chain(conn, job_type, Note(text=text), **options)
        await conn.commit()
    return started


async def wait_until(check: Callable[[], Awaitable[bool]], *, timeout: float = 20.0) -> None:
    """Poll ``check`` (a database read) until it holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await anyio.sleep(0.05)


async def job_status(client: Client, job_id: UUID) -> JobStatus:
    return (await client.get_job(job_id)).status


async def run_until_settled(client: Client, ids: list[UUID]) -> None:
    """Run a worker until every job of ``ids`` has ended."""
    worker = create_in_process_worker(client=client, processors=PROCESSORS, poll_interval=0.2)
    async with worker:

        async def settled() -> bool:
            return all([(await job_status(client, i)).is_final for i in ids])

        await wait_until(settled)


async def csrf_token(http: httpx.AsyncClient) -> str:
    """Load a page with a form, as a browser would (the dashboard sets its CSRF cookie
    then), and return the token its forms carry."""
    response = await http.get("/failed")
    assert response.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', response.text)
    assert found, "no CSRF field on /failed"
    assert http.cookies.get("pgwork_csrf")
    return found.group(1)


async def act(http: httpx.AsyncClient, action: str, **fields: Any) -> httpx.Response:
    token = await csrf_token(http)
    return await http.post(f"/actions/{action}", data={"csrf": token, **fields})
