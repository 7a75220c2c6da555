"""Finding jobs by an input field on /search: one job type, a value compared as JSON,
a bounded look at the newest jobs that says how far it got and goes further on demand,
and a clear answer (never a server error) to whatever is typed into the form."""

from __future__ import annotations

import re

import httpx
import psycopg
import pytest
from tests.dashboard._support import Note, Order, echo, orders

from pgwork import Client
from pgwork.dashboard import _work_pages

pytestmark = pytest.mark.anyio


def found(html: str) -> list[str]:
    table = re.search(r'<table data-testid="input-found">(.*?)</table>', html, re.S)
    assert table, "no result table"
    return re.findall(r'<tr data-job="([^"]+)"', table.group(1))


def further(html: str) -> str | None:
    link = re.search(r'<a rel="next" href="([^"]+)">Look further back', html)
    return link.group(1).replace("&amp;", "&") if link else None


async def enqueue(client: Client, dsn: str, *inputs: Order | Note) -> list[str]:
    """One transaction per job, so ids (and creation) follow the order given."""
    ids = []
    for data in inputs:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            job_type = orders if isinstance(data, Order) else echo
            started = await client.start_chain(conn, job_type, data)
            await conn.commit()
        ids.append(str(started.id))
    return ids


async def test_a_field_is_compared_as_json_within_the_type_given(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    number, text, other, noted = await enqueue(
        client,
        pgwork_dsn,
        Order(user_id=42, email="ada@example.com"),
        Order(user_id="42"),
        Order(user_id=7),
        Note(text="42"),
    )

    async def search(field: str, value: str, type_name: str = "dash.orders") -> list[str]:
        page = await http.get("/search", params={"type": type_name, "field": field, "value": value})
        assert page.status_code == 200, page.text
        return found(page.text)

    assert await search("user_id", "42") == [number]
    assert await search("input.user_id", '"42"') == [text]
    assert await search("email", '"ada@example.com"') == [number]
    assert await search("text", '"42"', "dash.echo") == [noted]
    assert await search("user_id", "43") == []
    page = await http.get(
        "/search", params={"type": "dash.orders", "field": "user_id", "value": "7"}
    )
    assert f'href="/jobs/{other}"' in page.text
    assert "Looked at 4 jobs" in page.text
    assert "That is every job stored." in page.text


async def test_the_page_says_how_far_it_looked_and_looks_further_on_demand(
    client: Client,
    pgwork_dsn: str,
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_work_pages, "INPUT_EXAMINED", 3)
    oldest, *_, newest = await enqueue(
        client,
        pgwork_dsn,
        Order(user_id=1),
        *[Order(user_id=2) for _ in range(4)],
        Order(user_id=1),
    )
    params = {"type": "dash.orders", "field": "user_id", "value": "1"}

    first = (await http.get("/search", params=params)).text
    assert found(first) == [newest]
    assert "Looked at 3 jobs, back to those created" in first
    link = further(first)
    assert link is not None

    second = (await http.get(link)).text
    assert found(second) == [oldest]
    assert "Looked at 3 jobs" in second
    assert further(second) is None
    assert "That is every job stored." in second


HOSTILE = {
    "not JSON": ({"value": "ada@example.com"}, "is not JSON"),
    "an unclosed quote": ({"value": '"ada'}, "is not JSON"),
    "quotes in the field": ({"field": "user'\"id"}, "Looked at"),
    "a NUL in the value": ({"value": '"a\\u0000b"'}, "NUL character"),
    "a raw NUL in the value": ({"value": "\x00"}, "NUL character"),
    "a NUL in the field": ({"field": "user\x00id"}, "NUL character"),
    "a NUL in the type": ({"type": "dash\x00orders"}, "NUL character"),
    "a lone surrogate": ({"value": '"\\ud800"'}, "not Unicode text"),
    "a very long value": ({"value": "1" * 20_000}, "at most 1000"),
    "a very long field": ({"field": "k" * 5000}, "at most 256"),
    "too deep a field": ({"field": ".".join("k" * 17)}, "at most 16"),
    "an empty key": ({"field": "user..id"}, "is empty"),
    "NaN": ({"value": "NaN"}, "JSON numbers are finite"),
    "a number beyond a float": ({"value": "1e999"}, "cannot be written as JSON"),
    "no type": ({"type": ""}, "choose the job type"),
    "no value": ({"value": ""}, "value is empty"),
    "markup": ({"value": "<script>alert(1)</script>"}, "is not JSON"),
    "a forged cursor": ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
async def test_hostile_input_gets_a_clear_answer_not_a_server_error(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient, case: str
) -> None:
    await enqueue(client, pgwork_dsn, Order(user_id=42))
    given, says = HOSTILE[case]
    params = {"type": "dash.orders", "field": "user_id", "value": "42", **given}

    page = await http.get("/search", params=params)

    assert page.status_code in (200, 400), page.text
    assert says in page.text.replace("&#39;", "'").replace("&#34;", '"')
    assert "<script>alert(1)</script>" not in page.text
