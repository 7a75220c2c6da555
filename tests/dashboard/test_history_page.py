"""The history page: what ended, per queue and type, over days; still there once the
jobs are deleted; filtered by queue and type; every window drawn."""

from __future__ import annotations

import re

import httpx
import psycopg
import pytest
from tests.dashboard._support import breaks, echo, mail, run_until_settled, start, wait_until

from pgwork import Client

pytestmark = pytest.mark.anyio


def groups(html: str) -> dict[str, tuple[int, int]]:
    """(completed, failed) per ``queue/type`` row of the page's table."""
    found = {}
    for row in re.findall(r'<tr data-group="([^"]+)">(.*?)</tr>', html, re.S):
        key, cells = row
        done = re.search(r'data-col="completed">(\d+)<', cells)
        failed = re.search(r'data-col="failed">(\d+)<', cells)
        assert done, cells
        assert failed, cells
        found[key] = (int(done.group(1)), int(failed.group(1)))
    return found


async def test_the_history_page_shows_what_ended_after_the_jobs_are_gone(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    ids = [(await start(client, pgwork_dsn, echo, f"e{n}")).id for n in range(5)]
    ids += [(await start(client, pgwork_dsn, breaks, f"b{n}")).id for n in range(2)]
    ids += [(await start(client, pgwork_dsn, mail, "m")).id]
    await run_until_settled(client, ids)

    before = (await http.get("/history")).text
    assert "Nothing counted yet" in before
    assert groups(before) == {}

    async def counted() -> bool:
        # A rollup counts what ended over a second ago (ends may still commit later).
        await client.roll_up_history()
        ended = await client.job_history()
        return sum(p.figures.ended for p in ended.points) == len(ids)

    await wait_until(counted)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        await conn.execute("DELETE FROM pgwork.jobs")
        # A queue name is text a user chose: shown as text.
        await conn.execute(
            "INSERT INTO pgwork.job_history SELECT bucket_seconds,"
            " '<b>q</b>', type_name, bucket_start, completed, failed, wait_count,"
            " wait_sum_s, wait_max_s, wait_hist, run_count, run_sum_s, run_max_s, run_hist"
            " FROM pgwork.job_history WHERE queue = 'mail' AND type_name <> ''"
        )

    response = await http.get("/history")
    assert response.status_code == 200
    html = response.text
    assert "6 completed, 2 failed." in html  # the copy is in no total
    assert "Counted up to" in html
    assert groups(html) == {
        "default/dash.echo": (5, 0),
        "default/dash.breaks": (0, 2),
        "mail/dash.mail": (1, 0),
        "&lt;b&gt;q&lt;/b&gt;/dash.mail": (1, 0),
    }
    assert "<b>q</b>" not in html
    # One bar per ten minutes of the day, each with its figures on hover.
    bars = re.findall(r"UTC: (\d+) completed, (\d+) failed</title>", html)
    assert 145 <= len(bars) <= 150  # from the start of the hour the day began in, to now
    assert (sum(int(d) for d, _ in bars), sum(int(f) for _, f in bars)) == (6, 2)

    mine = (await http.get("/history", params={"queue": "default", "type": "dash.echo"})).text
    assert groups(mine) == {"default/dash.echo": (5, 0)}
    assert "5 completed, 0 failed." in mine
    for window in ("7d", "30d", "90d"):
        page = await http.get("/history", params={"window": window})
        assert page.status_code == 200
        assert groups(page.text)["default/dash.breaks"] == (0, 2)
    assert 'href="/history"' in (await http.get("/")).text  # in the navigation
