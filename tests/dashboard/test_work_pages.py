"""The work pages over HTTP: jobs by status, queues and who consumes them, workers and
what they run, failures grouped by error, ids by prefix, run now."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from tests.dashboard._support import (
    PROCESSORS,
    Note,
    act,
    breaks,
    echo,
    job_status,
    mail,
    run_until_settled,
    start,
    wait_until,
)

from pgwork import Client, create_in_process_worker
from pgwork.dashboard import allow_any, create_dashboard
from pgwork.records import JobStatus
from pgwork.schedules import CronSchedule

pytestmark = pytest.mark.anyio


def rows(html: str, attribute: str = "data-job") -> list[str]:
    return re.findall(rf'<tr {attribute}="([^"]+)"', html)


def next_link(html: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', html)
    return found.group(1).replace("&amp;", "&") if found else None


async def sql(dsn: str, statement: str, params: dict[str, Any] | None = None) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(statement, params)


async def test_jobs_lists_a_queues_ready_jobs_however_many_chains_are_newer(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    """The chains page filters a window of chains by queue; the jobs page reads the
    queue's own index range, so 40 jobs nobody takes show at once."""
    mailed = [str((await start(client, pgwork_dsn, mail, f"m{i}")).id) for i in range(40)]
    for i in range(250):
        await start(client, pgwork_dsn, echo, f"e{i}")

    html = (await http.get("/jobs?status=ready&queue=mail")).text

    assert rows(html) == mailed  # oldest first: in the order they were enqueued
    assert next_link(html) is None
    newest = (await http.get("/jobs?status=ready&queue=mail&order=newest")).text
    assert rows(newest) == mailed[::-1]


async def test_jobs_pages_walk_every_lane_once_in_time_order(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    """Jobs of several queues and priorities merge into one time order, and the next
    links visit each job exactly once."""
    made = []
    for i in range(130):
        job_type, priority = [(echo, 0), (mail, 0), (echo, 5)][i % 3]
        made.append(str((await start(client, pgwork_dsn, job_type, f"j{i}", priority=priority)).id))

    for order, expected in (("oldest", made), ("newest", made[::-1])):
        seen: list[str] = []
        url: str | None = f"/jobs?status=ready&order={order}"
        while url:
            html = (await http.get(url)).text
            seen += rows(html)
            url = next_link(html)
        assert seen == expected, order


async def test_scheduled_jobs_can_be_run_now(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    later = await start(client, pgwork_dsn, mail, "later", schedule=timedelta(hours=1))
    assert rows((await http.get("/jobs?status=ready")).text) == []
    assert rows((await http.get("/jobs?status=scheduled")).text) == [str(later.id)]

    response = await act(http, "trigger", job_id=str(later.id), next="/jobs?status=scheduled")

    assert response.status_code == 303
    assert response.headers["location"] == "/jobs?status=scheduled"
    assert rows((await http.get("/jobs?status=ready")).text) == [str(later.id)]
    assert rows((await http.get("/jobs?status=scheduled")).text) == []


async def test_run_now_refuses_a_job_that_is_not_pending(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    done = await start(client, pgwork_dsn, echo, "done")
    await run_until_settled(client, [done.id])

    response = await act(http, "trigger", job_id=str(done.id))

    assert response.status_code == 409
    assert "completed, not scheduled" in response.text
    assert await job_status(client, done.id) is JobStatus.COMPLETED


async def test_run_now_without_the_csrf_token_changes_nothing(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    later = await start(client, pgwork_dsn, mail, "later", schedule=timedelta(hours=1))

    response = await http.post("/actions/trigger", data={"job_id": str(later.id)})

    assert response.status_code == 403
    assert rows((await http.get("/jobs?status=scheduled")).text) == [str(later.id)]


async def _dead_worker_with_a_job(client: Client, dsn: str) -> str:
    """The rows a ``kill -9`` leaves: a busy worker whose heartbeat stopped long ago,
    and the job it held, still running under its lease."""
    job = await start(client, dsn, echo, "held")
    await sql(
        dsn,
        "INSERT INTO pgwork.workers (id, host, pid, queues, job_types, max_slots,"
        " active_slots, status, started_at, heartbeat_at)"
        " VALUES ('w-killed', 'h', 1, ARRAY['default'], ARRAY['dash.echo'], 3, 3, 'busy',"
        " now() - interval '1 hour', now() - interval '5 minutes')",
    )
    await sql(
        dsn,
        "UPDATE pgwork.jobs SET status = 'running', attempt = 1, leased_by = 'w-killed',"
        " lease_token = gen_random_uuid(), started_at = now() - interval '6 minutes',"
        " leased_until = now() + interval '6 seconds' WHERE id = %(id)s",
        {"id": job.id},
    )
    return str(job.id)


async def test_workers_page_lists_each_workers_jobs_and_tells_dead_from_stopped(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    await run_until_settled(client, [(await start(client, pgwork_dsn, echo, "x")).id])
    held = await _dead_worker_with_a_job(client, pgwork_dsn)

    html = (await http.get("/workers")).text

    states = dict(re.findall(r'data-worker="([^"]+)" data-state="([^"]+)"', html))
    assert states.pop("w-killed") == "dead"
    assert list(states.values()) == ["stopped"]  # the worker that ran "x" and stopped
    killed = re.search(r'data-worker="w-killed".*?</tr>', html, re.S)
    assert killed
    assert f'href="/jobs/{held}"' in killed.group(0)
    assert "worker dead, job will be reclaimed" in killed.group(0)
    assert "3 / 3" not in killed.group(0)
    assert html.count("status-dead") == 2  # the dead worker and its job; not the stopped one


async def test_running_jobs_show_since_when_and_a_dead_workers_jobs_are_flagged(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    held = await _dead_worker_with_a_job(client, pgwork_dsn)

    html = (await http.get("/jobs?status=running")).text

    assert rows(html) == [held]
    assert re.search(r'data-testid="running-since">6m ago<', html)
    assert "worker dead, job will be reclaimed" in html
    assert rows((await http.get("/jobs?status=running&worker=w-killed")).text) == [held]
    assert rows((await http.get("/jobs?status=running&worker=other")).text) == []


async def test_queues_show_oldest_ready_age_and_flag_work_nobody_takes(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    await start(client, pgwork_dsn, mail, "nobody reads the mail queue")
    await start(client, pgwork_dsn, breaks, "nobody handles dash.breaks")
    await start(client, pgwork_dsn, echo, "echo is handled")
    await sql(
        pgwork_dsn,
        "UPDATE pgwork.jobs SET scheduled_at = now() - interval '20 minutes'"
        " WHERE type_name = 'dash.breaks'",
    )
    await sql(
        pgwork_dsn,
        "INSERT INTO pgwork.workers (id, host, pid, queues, job_types, max_slots)"
        " VALUES ('w-live', 'h', 1, ARRAY['default'], ARRAY['dash.echo'], 2)",
    )

    html = (await http.get("/queues")).text

    queues = dict(re.findall(r'<tr data-queue="([^"]+)"[^>]*>(.*?)</tr>', html, re.S))
    assert "no live worker consumes this queue" in queues["mail"]
    assert "no live worker consumes" not in queues["default"]
    unhandled = re.findall(r'data-testid="unhandled-type">.*?</div>', queues["default"], re.S)
    assert len(unhandled) == 1
    assert "dash.breaks" in unhandled[0]
    assert "dash.echo" not in queues["default"].split("live worker", 1)[1]
    assert re.search(r'data-testid="oldest-ready"[^>]*>20\.\d min<', queues["default"])


async def test_errors_group_failures_and_link_to_exactly_those_jobs(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    same = [await start(client, pgwork_dsn, breaks, "KeyError: 'user'") for _ in range(3)]
    other = await start(client, pgwork_dsn, breaks, "other")
    await run_until_settled(client, [s.id for s in [*same, other]])

    html = (await http.get("/errors")).text

    counts = re.findall(r'<a href="([^"]+)" data-testid="group-count">(\d+)</a>', html)
    assert [n for _, n in counts] == ["3", "1"]
    listed = (await http.get(counts[0][0].replace("&amp;", "&"))).text
    assert sorted(rows(listed)) == sorted(str(s.id) for s in same)
    assert "KeyError: &#39;user&#39;" in listed


async def test_search_finds_jobs_and_chains_by_id_prefix(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    chains = [await start(client, pgwork_dsn, echo, f"s{i}") for i in range(3)]
    wanted = chains[1].id

    found = await http.get(f"/search?id={str(wanted)[:23]}")  # time and random digits

    assert found.status_code == 303
    assert found.headers["location"] == f"/chains/{wanted}"
    timestamp_only = (await http.get(f"/search?id={wanted.hex[:6]}")).text
    assert set(rows(timestamp_only)) >= {str(c.id) for c in chains}
    assert rows((await http.get("/search?id=ffffffff")).text) == []
    bad = await http.get("/search?id=not-hex")
    assert bad.status_code == 400
    assert "hexadecimal" in bad.text


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("/jobs?status=nope", "unknown work status"),
        ("/jobs?status=ready&cursor=garbage", "cursor"),
    ],
)
async def test_jobs_bad_filters_say_what_is_wrong(
    http: httpx.AsyncClient, path: str, text: str
) -> None:
    response = await http.get(path)

    assert response.status_code == 400
    assert text in response.text


async def test_retry_all_retries_every_failed_job_the_filter_matches_and_keeps_it(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    same = [await start(client, pgwork_dsn, breaks, " KeyError: 'user'") for _ in range(3)]
    other = await start(client, pgwork_dsn, breaks, "other")
    await run_until_settled(client, [s.id for s in [*same, other]])
    listing = "/jobs?status=failed&error_message=+KeyError%3A+%27user%27"
    assert sorted(rows((await http.get(listing)).text)) == sorted(str(s.id) for s in same)

    response = await act(
        http, "retry_all", error_type="", error_message=" KeyError: 'user'", next=listing
    )

    assert response.status_code == 303
    assert response.headers["location"] == listing
    assert [await job_status(client, s.id) for s in same] == [JobStatus.PENDING] * 3
    assert await job_status(client, other.id) is JobStatus.FAILED


async def test_failed_page_retry_comes_back_to_the_filtered_listing(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    broken = await start(client, pgwork_dsn, breaks, "x")
    await run_until_settled(client, [broken.id])

    html = (await http.get("/failed?type=dash.breaks&queue=default")).text

    assert 'name="next" value="/failed?type=dash.breaks&amp;queue=default"' in html


async def test_a_worker_with_many_jobs_lists_ten_and_links_to_all(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    for i in range(12):
        await start(client, pgwork_dsn, echo, f"busy {i}")
    await sql(
        pgwork_dsn,
        "INSERT INTO pgwork.workers (id, host, pid, queues, job_types, max_slots,"
        " active_slots, status) VALUES ('w-busy', 'h', 1, ARRAY['default'],"
        " ARRAY['dash.echo'], 12, 12, 'busy')",
    )
    await sql(
        pgwork_dsn,
        "UPDATE pgwork.jobs SET status = 'running', attempt = 1, leased_by = 'w-busy',"
        " lease_token = gen_random_uuid(), started_at = now(),"
        " leased_until = now() + interval '1 minute'",
    )

    html = (await http.get("/workers")).text

    cell = re.search(r'data-testid="worker-jobs">(.*?)</td>', html, re.S)
    assert cell
    assert cell.group(1).count('href="/jobs/') == 10
    assert 'href="/jobs?status=running&amp;worker=w-busy">all 12 of its jobs' in cell.group(1)


async def test_schedules_show_next_fire_time_and_the_latest_ticks_chain(
    client: Client, pgwork_dsn: str
) -> None:
    every_minute = CronSchedule(
        "minutely", "* * * * *", echo, Note(text="tick"), misfire_grace=timedelta(hours=1)
    )
    yearly = CronSchedule("new-year", "0 0 1 1 *", mail, Note(text="hny"))
    worker = create_in_process_worker(
        client=client, processors=PROCESSORS, poll_interval=0.2, schedules=[every_minute]
    )
    async with worker:

        async def fired() -> bool:
            page = await client.list_chains(type_name="dash.echo", limit=1)
            return bool(page.items)

        await wait_until(fired)
    app = create_dashboard(client, authorize=allow_any, schedules=[every_minute, yearly])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        before = datetime.now(UTC)
        html = (await http.get("/schedules")).text
        after = datetime.now(UTC)

    found = dict(re.findall(r'<tr data-schedule="([^"]+)"[^>]*>(.*?)</tr>', html, re.S))
    chain = (await client.list_chains(type_name="dash.echo", limit=1)).items[0]
    assert f'href="/chains/{chain.id}"' in found["minutely"]
    next_fire = re.search(r'data-testid="next-fire"[^>]*>([^<]+) UTC<', found["minutely"])
    assert next_fire
    at = datetime.strptime(next_fire.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    # The first whole minute after the moment the page was drawn.
    assert at.second == 0
    assert before < at
    assert at - timedelta(minutes=1) <= after
    assert f"{datetime.now(UTC).year + 1}-01-01 00:00:00 UTC" in found["new-year"]
    assert "missed" in found["new-year"]  # no worker ran it within its minute of grace


async def test_schedules_page_without_schedules_says_how_to_give_them(
    http: httpx.AsyncClient,
) -> None:
    html = (await http.get("/schedules")).text

    assert "create_dashboard(..., schedules=[...])" in html


async def test_a_job_held_by_a_dead_worker_says_it_will_be_reclaimed(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    held = await _dead_worker_with_a_job(client, pgwork_dsn)

    html = (await http.get(f"/jobs/{held}")).text

    assert "w-killed until" in html
    assert "worker dead, job will be reclaimed" in html


async def test_overview_counts_a_cleanly_stopped_worker_as_stopped_not_dead(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    await run_until_settled(client, [(await start(client, pgwork_dsn, echo, "x")).id])

    assert " dead</a>" not in (await http.get("/")).text
    await _dead_worker_with_a_job(client, pgwork_dsn)
    assert "1 dead</a>" in (await http.get("/")).text
