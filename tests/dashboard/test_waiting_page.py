"""The waiting page lists the chains that wait and the pending signals; a chain's page
says what its current step waits for."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta
from uuid import UUID

import httpx
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Client,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
)
from pgwork.dashboard import allow_any, create_dashboard

pytestmark = pytest.mark.anyio


class Ask(BaseModel):
    id: str


class Answer(BaseModel):
    ok: bool


registry = JobTypeRegistry()
approval = registry.signal("approval", payload=Answer)
decide = registry.job_type("decide", input=Ask, entry=False, waits_for=approval)
ask = registry.job_type("ask", input=Ask, continue_with=[decide])
gate = registry.job_type("gate", input=Ask)


@pytest.fixture
async def client(pgwork_dsn: str) -> AsyncIterator[Client]:
    made = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=registry,
        observers=[],
    )
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
async def http(client: Client) -> AsyncIterator[httpx.AsyncClient]:
    app = create_dashboard(client, authorize=allow_any)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as session:
        yield session


async def _asking(client: Client, dsn: str, key: str, timeout: timedelta | None) -> UUID:
    """A chain handed on (from outside a worker) to a step waiting for its approval."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started = await client.start_chain(conn, ask, Ask(id=key))
        step = Continue(decide, Ask(id=key), wait_for=approval.named(key, timeout=timeout))
        await client.complete_job(conn, started.job_id, continue_with=step)
        await conn.commit()
    return started.id


def _rows(html: str, table: str) -> dict[str, str]:
    """The rows of the table ``data-testid=table`` by their first data attribute's value,
    as text without tags."""
    found = re.search(rf'<table data-testid="{table}">(.*?)</table>', html, re.S)
    assert found, table
    rows = re.findall(r'<tr data-\w+="([^"]+)"[^>]*>(.*?)</tr>', found.group(1), re.S)
    return {key: " ".join(re.sub(r"<[^>]+>", " ", body).split()) for key, body in rows}


async def test_the_waiting_page_lists_waiting_chains_and_pending_signals(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    timed = await _asking(client, pgwork_dsn, "a-1", timedelta(days=2))
    endless = await _asking(client, pgwork_dsn, "b-1", None)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        later = await client.start_chain(conn, gate, Ask(id="x"), schedule=timedelta(hours=3))
        await client.signal(conn, approval, "nobody", Answer(ok=True))
        await conn.commit()

    page = await http.get("/waiting")

    assert page.status_code == 200
    assert 'href="/waiting" aria-current="page"' in page.text
    waiting = _rows(page.text, "waiting")
    assert list(waiting) == [str(later.id), str(endless), str(timed)]
    assert "signal approval:a-1" in waiting[str(timed)]
    assert waiting[str(timed)].endswith("in 1d")
    assert waiting[str(endless)].endswith("no timeout")
    assert "sleep" in waiting[str(later.id)]
    assert waiting[str(later.id)].endswith("in 2h")
    signals = _rows(page.text, "signals")
    assert [text.split()[1] for text in signals.values()] == ["approval:nobody"]

    by_prefix = _rows((await http.get("/waiting", params={"signal": "approval:b"})).text, "waiting")
    assert list(by_prefix) == [str(endless)]
    sleeping = _rows((await http.get("/waiting", params={"kind": "sleep"})).text, "waiting")
    assert list(sleeping) == [str(later.id)]
    assert (await http.get("/waiting", params={"kind": "nap"})).status_code == 400
    assert 'href="/waiting"' in (await http.get("/")).text  # in the navigation


async def test_a_chain_page_says_what_its_step_waits_for(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    timed = await _asking(client, pgwork_dsn, "c-1", timedelta(days=2))
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        ready = await client.start_chain(conn, gate, Ask(id="y"))
        await conn.commit()

    html = (await http.get(f"/chains/{timed}")).text

    found = re.search(r'<dd data-testid="waiting" data-kind="signal">(.*?)</dd>', html, re.S)
    assert found, html
    text = " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())
    assert re.fullmatch(
        r"step 1 \(decide\) waits for signal approval:c-1 , timeout \S+ \S+ UTC \(in 1d\);"
        r" waiting since \S+ \S+ UTC \(\d+s ago\)",
        text,
    ), text
    # A chain whose job is ready waits for a worker only.
    assert 'data-testid="waiting"' not in (await http.get(f"/chains/{ready.id}")).text
