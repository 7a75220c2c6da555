"""The read pages over HTTP: what each shows, filters, keyset pages, bad input."""

from __future__ import annotations

import re
from datetime import timedelta
from uuid import UUID, uuid4

import httpx
import psycopg
import pytest
from tests.dashboard._support import (
    Note,
    breaks,
    echo,
    mail,
    retries,
    run_until_settled,
    start,
    waits,
)

from pgwork import ChainStart, Client, Debounce, DedupSpec
from pgwork._ids import new_ids
from pgwork.dashboard._format import short_id

pytestmark = pytest.mark.anyio


def cell(html: str, queue: str, column: str) -> str:
    row = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', html, re.S)
    assert row, f"no row for queue {queue}"
    found = re.search(rf'data-col="{column}">(.*?)</td>', row.group(1), re.S)
    assert found, f"no {column} cell for {queue}"
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


async def test_overview_counts_each_queues_work_and_the_last_hours_outcomes(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    done = [await start(client, pgwork_dsn, echo, f"n{i}") for i in range(3)]
    broken = await start(client, pgwork_dsn, breaks, "boom")
    await run_until_settled(client, [s.id for s in [*done, broken]])
    await start(client, pgwork_dsn, mail, "later", schedule=timedelta(hours=1))
    await start(client, pgwork_dsn, mail, "now")
    await client.pause_queue("mail")

    page = (await http.get("/")).text

    assert cell(page, "default", "completed-1h") == "3"
    assert cell(page, "default", "failed-1h") == "1"
    assert cell(page, "default", "failed") == "1"
    assert cell(page, "mail", "pending") == "1"
    assert cell(page, "mail", "scheduled") == "1"
    assert cell(page, "mail", "state") == "paused"
    assert "<svg" in page
    assert "3 completed, 1 failed" in page


async def test_chains_filter_by_status_type_and_queue(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    finished = await start(client, pgwork_dsn, echo, "done")
    await run_until_settled(client, [finished.id])
    mailed = await start(client, pgwork_dsn, mail, "queued")
    keyed = await start(client, pgwork_dsn, echo, "keyed", dedup=DedupSpec("order-42"))

    async def listed(**params: str) -> set[str]:
        response = await http.get("/chains", params=params)
        assert response.status_code == 200
        return set(re.findall(r'<tr data-chain="([0-9a-f-]+)">', response.text))

    assert await listed() == {str(finished.id), str(mailed.id), str(keyed.id)}
    assert await listed(status="completed") == {str(finished.id)}
    assert await listed(type="dash.mail") == {str(mailed.id)}
    assert await listed(queue="mail") == {str(mailed.id)}
    assert await listed(q="order-42") == {str(keyed.id)}
    assert await listed(status="active", queue="default") == {str(keyed.id)}


async def test_chains_pages_follow_the_next_link_through_every_chain_once(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    started = {str((await start(client, pgwork_dsn, echo, f"c{i}")).id) for i in range(120)}

    seen: list[str] = []
    url: str | None = "/chains"
    pages = 0
    while url:
        html = (await http.get(url)).text
        seen += re.findall(r'<tr data-chain="([0-9a-f-]+)">', html)
        found = re.search(r'<a href="([^"]+)" rel="next">', html)
        url = found.group(1).replace("&amp;", "&") if found else None
        pages += 1

    assert pages == 3
    assert len(seen) == len(set(seen)) == 120
    assert set(seen) == started


async def test_search_by_chain_or_job_id_opens_it(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    chain = await start(client, pgwork_dsn, echo, "find me")

    found = await http.get("/chains", params={"q": str(chain.id)})
    assert found.status_code == 303
    assert found.headers["location"] == f"/chains/{chain.id}"

    nothing = await http.get("/chains", params={"q": str(uuid4())})
    assert nothing.status_code == 200
    assert "No chain or job has the id" in nothing.text


async def test_chain_page_lists_its_jobs_its_blockers_and_what_it_blocks(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    first = await start(client, pgwork_dsn, echo, "first")
    await run_until_settled(client, [first.id])
    merge = await start(client, pgwork_dsn, waits, "merge", blockers=[first.id])

    blocker_page = (await http.get(f"/chains/{first.id}")).text
    merge_page = (await http.get(f"/chains/{merge.id}")).text

    assert "FIRST" in blocker_page  # the chain's output (echo upper-cases)
    assert f'href="/chains/{merge.id}"' in blocker_page  # what it blocks
    assert f'href="/chains/{first.id}"' in merge_page  # what it waits for
    assert f'href="/jobs/{merge.job_id}"' in merge_page


async def test_job_page_shows_input_error_traceback_and_lease(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    broken = await start(client, pgwork_dsn, breaks, "the disk is full")
    await run_until_settled(client, [broken.id])

    page = (await http.get(f"/jobs/{broken.id}")).text

    assert "RuntimeError" in page
    assert "the disk is full" in page
    assert "Traceback" in page
    assert "1 of 1" in page  # attempts
    assert "Retry job" in page


async def test_job_page_shows_the_limit_key(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    keyed = await start(client, pgwork_dsn, mail, "keyed", limit_key="tenant <42>")
    plain = await start(client, pgwork_dsn, mail, "plain")

    keyed_page = (await http.get(f"/jobs/{keyed.id}")).text
    plain_page = (await http.get(f"/jobs/{plain.id}")).text

    assert '<dd data-testid="limit-key">tenant &lt;42&gt;</dd>' in keyed_page
    assert '<dd data-testid="limit-key">—</dd>' in plain_page


async def test_chain_and_job_pages_give_a_debounced_jobs_next_start_and_deadline(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    spec = Debounce("digest <7>", delay=timedelta(minutes=5), max_wait=timedelta(hours=1))
    first = await start(client, pgwork_dsn, mail, "one", dedup=spec)
    again = await start(client, pgwork_dsn, mail, "two", dedup=spec)
    plain = await start(client, pgwork_dsn, mail, "plain")
    assert again.debounced
    assert again.id == first.id
    job = await client.get_job(first.job_id)
    assert job.debounce_deadline is not None
    shown = re.compile(
        rf"next start {job.scheduled_at:%Y-%m-%d %H:%M:%S} UTC \(in \dm\), "
        rf"deadline {job.debounce_deadline:%Y-%m-%d %H:%M:%S} UTC \(in \d+m\)"
    )

    for path in (f"/chains/{first.id}", f"/jobs/{first.id}"):
        page = (await http.get(path)).text
        [debounced] = re.findall(r'<dd data-testid="debounced">(.*?)</dd>', page)
        assert shown.fullmatch(debounced), debounced
        assert "digest &lt;7&gt;" in page
    assert 'data-testid="debounced"' not in (await http.get(f"/chains/{plain.id}")).text
    assert 'data-testid="debounced"' not in (await http.get(f"/jobs/{plain.id}")).text


async def test_job_page_shows_each_failed_attempt_newest_first(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    job = await start(client, pgwork_dsn, retries, "no such key")
    await run_until_settled(client, [job.id])

    page = (await http.get(f"/jobs/{job.id}")).text

    table = re.search(r'<table data-testid="attempt-history">(.*?)</table>', page, re.S)
    assert table, "no attempt history on the job page"
    rows = re.findall(r"<tr>\s*<td>(\d+)</td>(.*?)</tr>", table.group(1), re.S)
    assert [int(n) for n, _ in rows] == [3, 2, 1]
    for n, row in rows:
        assert f"no such key #{n}" in row
        assert "KeyError" in row
        assert "Traceback (end)" in row
    # The worker measured how long each attempt ran.
    history = (await client.get_job(job.id)).attempt_history
    assert [a.attempt for a in history] == [1, 2, 3]
    assert all(a.ran_for is not None and a.ran_for.total_seconds() >= 0 for a in history)


async def test_a_large_payload_is_cut_with_a_link_to_all_of_it(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    big = await start(client, pgwork_dsn, echo, "x" * 9000 + "THE-END")

    cut = (await http.get(f"/jobs/{big.id}")).text
    whole = (await http.get(f"/jobs/{big.id}", params={"full": "input"})).text

    assert "THE-END" not in cut
    assert "Show all" in cut
    assert "THE-END" in whole


async def test_failed_page_lists_failed_jobs_with_their_error(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    broken = await start(client, pgwork_dsn, breaks, "no route to host")
    fine = await start(client, pgwork_dsn, echo, "fine")
    await run_until_settled(client, [broken.id, fine.id])

    page = (await http.get("/failed")).text

    assert f'data-job="{broken.id}"' in page
    assert f'data-job="{fine.id}"' not in page
    assert "no route to host" in page
    assert 'name="job_id"' in page  # bulk selection


async def test_workers_page_shows_a_cleanly_stopped_worker_as_stopped(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    await run_until_settled(client, [(await start(client, pgwork_dsn, echo, "x")).id])

    page = (await http.get("/workers")).text

    # The worker stopped when its block ended: it is listed as stopped, not dead.
    assert page.count('class="stopped"') == 1
    assert "status-stopped" in page
    assert "status-dead" not in page


@pytest.mark.parametrize(
    ("path", "status", "text"),
    [
        ("/chains?status=nope", 400, "unknown chain status"),
        ("/chains?cursor=garbage", 400, "cursor"),
        ("/failed?cursor=garbage", 400, "cursor"),
        (f"/chains/{UUID(int=5)}", 404, "No such chain"),
        (f"/jobs/{UUID(int=5)}", 404, "No such job"),
        ("/jobs/not-a-uuid", 404, "No such job"),
        ("/nowhere", 404, "No dashboard page"),
    ],
)
async def test_bad_addresses_get_a_page_that_says_what_is_wrong(
    http: httpx.AsyncClient, path: str, status: int, text: str
) -> None:
    response = await http.get(path)

    assert response.status_code == status
    assert text in response.text


async def test_queue_filter_reads_a_window_and_its_next_link_skips_nothing(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    mailed = [str((await start(client, pgwork_dsn, mail, f"m{i}")).id) for i in range(3)]
    for i in range(250):  # more than one window of other chains, newer than the mail
        await start(client, pgwork_dsn, echo, f"e{i}")

    seen: list[str] = []
    url: str | None = "/chains?queue=mail"
    pages = 0
    while url:
        html = (await http.get(url)).text
        seen += re.findall(r'<tr data-chain="([0-9a-f-]+)">', html)
        found = re.search(r'<a href="([^"]+)" rel="next">', html)
        url = found.group(1).replace("&amp;", "&") if found else None
        pages += 1

    assert sorted(seen) == sorted(mailed)
    assert pages == 2  # the first window held none of them


def test_short_ids_of_ids_made_in_one_millisecond_are_distinct() -> None:
    ids = new_ids(2000)  # one timestamp: the first 12 hex digits of every id agree

    assert len({str(i)[:8] for i in ids}) == 1
    assert len({short_id(i) for i in ids}) == len(ids)
    assert all(str(i).endswith(short_id(i).lstrip("…")) for i in ids)


async def test_chains_made_in_one_batch_show_distinct_short_ids(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        await client.start_chains(conn, [ChainStart(echo, Note(text=f"b{i}")) for i in range(60)])
        await conn.commit()

    for path in ["/chains", "/chains?status=active"]:
        html = (await http.get(path)).text
        rows = re.findall(
            r'<tr data-chain="([0-9a-f-]+)">\s*<td><a [^>]*><code title="([^"]+)">([^<]+)</code>',
            html,
        )
        assert len(rows) == 50
        assert all(full == shown_for for full, shown_for, _ in rows)
        assert len({shown for _, _, shown in rows}) == 50
        assert all(full.endswith(shown.lstrip("…")) for full, _, shown in rows)
