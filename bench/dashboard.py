"""How long each dashboard page takes to render with a million jobs in the database.

    python -m bench.dashboard --dsn postgresql://postgres@127.0.0.1/postgres [--jobs N]
        [--drain N [--drain-slots S]] [--only TEXT ...]

Creates a fresh migrated database on the server (dropped afterwards), bulk-loads
``--jobs`` jobs straight into pgwork's tables with ``generate_series`` (a week of
history: mostly completed, some pending, scheduled, running, failed, blocked and
cancelled, several types and queues, chains of two jobs, dedup keys, blocker edges,
workers), vacuums and analyzes, then renders every page through httpx's ASGI transport
in this process and prints the median and p95 server time of each, in milliseconds.

``--drain N`` adds a backlog of N no-op jobs and times the pages while a pgwork worker
process (``--drain-slots`` slots) drains it (bench/_draining.py): the pages as an
operator sees them while workers run at full speed on the same machine. The run says
how fast the worker went and whether the backlog lasted until the last render.
``--only`` times the pages whose label contains one of the texts given.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import anyio
import httpx
import psycopg

from pgwork.testing import sample_statements

__all__ = ["main", "page_paths", "time_pages"]


async def _ids(dsn: str, type_name: str) -> dict[str, str]:
    """Ids of rows worth opening: a two-job chain, a failed job, a blocked chain, an
    id prefix shared by many jobs (a prefix only one job has redirects to that job), a
    dedup key, and the newest chain of ``type_name``'s input number."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        picks = {
            "chain": "SELECT chain_id FROM pgwork.jobs WHERE chain_index = 1 LIMIT 1",
            "failed": "SELECT id FROM pgwork.jobs WHERE status = 'failed' LIMIT 1",
            "blocked": "SELECT chain_id FROM pgwork.jobs WHERE status = 'blocked' LIMIT 1",
            "shared_prefix": "SELECT left(id::text, 6) FROM pgwork.jobs"
            " GROUP BY 1 ORDER BY count(*) DESC LIMIT 1",
            "key": "SELECT dedup_key FROM pgwork.jobs WHERE dedup_key IS NOT NULL LIMIT 1",
            "newest_email": "SELECT input ->> 'n' FROM pgwork.jobs"
            " WHERE type_name = %(type)s AND chain_index = 0 ORDER BY id DESC LIMIT 1",
        }
        found = {}
        for name, query in picks.items():
            row = await (await conn.execute(query, {"type": type_name})).fetchone()
            assert row is not None, name
            found[name] = str(row[0])
        return found


def page_paths(
    ids: dict[str, str], cursors: dict[str, str], type_name: str, queue: str
) -> dict[str, str]:
    """Every page the bench renders, by label: each route of the dashboard, and the
    listings filtered and paged as an operator does. ``ids``: from ``_ids``;
    ``cursors``: the next pages of ``/chains`` and ``/failed``; ``type_name`` and
    ``queue``: a busy type (whose inputs have an ``email`` field) and its queue."""
    email = f"user{ids['newest_email']}@example.com".replace("@", "%40")
    return {
        "overview `/`": "/",
        "chains `/chains`": "/chains",
        "chains, next page": cursors["chains"],
        "chains by status (failed)": "/chains?status=failed",
        "chains by type": f"/chains?type={type_name}",
        "chains by queue": f"/chains?queue={queue}",
        "chains by dedup key": f"/chains?q={ids['key']}",
        "chain `/chains/{id}`": f"/chains/{ids['chain']}",
        "blocked chain": f"/chains/{ids['blocked']}",
        "job `/jobs/{id}`": f"/jobs/{ids['failed']}",
        "workers `/workers`": "/workers",
        "failed `/failed`": "/failed",
        "failed, next page": cursors["failed"],
        "queues `/queues`": "/queues",
        "ready jobs `/jobs`": "/jobs?status=ready",
        "ready jobs of a queue": f"/jobs?status=ready&queue={queue}",
        "scheduled jobs": "/jobs?status=scheduled",
        "running jobs": "/jobs?status=running",
        "failed jobs, newest": "/jobs?status=failed&order=newest",
        "errors `/errors`": "/errors",
        "waiting `/waiting`": "/waiting",
        "limits `/limits`": "/limits",
        "schedules `/schedules`": "/schedules",
        "search by id prefix": f"/search?id={ids['shared_prefix']}",
        "search by input field (a match among the newest)": (
            f"/search?type={type_name}&field=email&value=%22{email}%22"
        ),
        "search by input field (none of 10,000 match)": (
            f"/search?type={type_name}&field=email&value=%22nobody%40example.com%22"
        ),
        "history, last day `/history`": "/history",
        "history, last week": "/history?window=7d",
        "history, 90 days": "/history?window=90d",
        "history of a queue and type": f"/history?queue={queue}&type={type_name}",
    }


def _next_page(html: str) -> str:
    """The href of a page's ``rel="next"`` link."""
    return html.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")


async def time_pages(
    dsn: str,
    repeat: int,
    only: list[str],
    *,
    type_name: str = "sample.email",
    queue: str = "mail",
) -> list[tuple[str, float, float]]:
    """(label, median ms, p95 ms) of each page of ``page_paths`` whose label contains
    one of ``only`` (all if empty), rendered ``repeat`` times after one that warms the
    plans and connections; the history is rolled up first, as the workers keep it."""
    from pgwork import PostgresStateAdapter, create_client
    from pgwork.dashboard import allow_any, create_dashboard
    from pgwork.job_types import JobTypeRegistry

    ids = await _ids(dsn, type_name)
    state = await PostgresStateAdapter.connect(dsn, max_size=4)
    client = create_client(state_adapter=state, registry=JobTypeRegistry(), observers=[])
    app = create_dashboard(client, authorize=allow_any)
    results = []
    try:
        started = time.perf_counter()
        steps = 1
        while not (await client.roll_up_history()).caught_up:  # what the workers count
            steps += 1
        took = time.perf_counter() - started
        print(f"history rolled up in {steps} steps of 10,000 jobs: {took:.1f} s\n")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            cursors = {
                "chains": _next_page((await http.get("/chains")).text),
                "failed": _next_page((await http.get("/failed")).text),
            }
            pages = page_paths(ids, cursors, type_name, queue)
            for label, path in pages.items():
                if only and not any(text in label for text in only):
                    continue
                took = []
                for _ in range(repeat + 1):
                    started = time.perf_counter()
                    response = await http.get(path)
                    took.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 200, (path, response.status_code)
                took = took[1:]  # the first warms the plan and connection
                p95 = statistics.quantiles(took, n=20)[-1] if len(took) >= 2 else took[0]
                results.append((label, statistics.median(took), p95))
    finally:
        await client.close()
    return results


async def _time_pages_draining(
    dsn: str, args: argparse.Namespace
) -> list[tuple[str, float, float]]:
    from bench._draining import draining

    async with draining(dsn, jobs=args.drain, slots=args.drain_slots) as drain:
        before = drain.handled
        results = await time_pages(dsn, args.repeat, args.only)
        seconds = time.perf_counter() - drain.started
        handled = drain.handled - before
        left = await drain.backlog()
    print(
        f"a worker with {args.drain_slots} slots drained {handled:,} jobs while the pages"
        f" were timed ({handled / seconds:,.0f} jobs/s over {seconds:.1f} s);"
        f" {left:,} of the backlog left\n"
    )
    if left == 0:
        print("the backlog ran out before the last render: raise --drain\n")
    return results


async def _run(args: argparse.Namespace) -> int:
    from bench._env import fresh_database, server
    from pgwork.testing.databases import create_migrated_database, unique_database_name

    with server(args.dsn) as (admin, _kind):
        name = unique_database_name("pgwork_bench_dash")
        template = create_migrated_database(admin, name)
        try:
            with fresh_database(admin, template=name) as dsn:
                started = time.perf_counter()
                with psycopg.connect(dsn, autocommit=True) as conn:
                    for statement in sample_statements(jobs=args.jobs):
                        conn.execute(statement)
                    row = conn.execute("SELECT count(*) FROM pgwork.jobs").fetchone()
                loaded = time.perf_counter() - started
                total = row[0] if row else 0
                print(f"loaded {total:,} jobs ({args.jobs:,} chains) in {loaded:.1f} s\n")
                if args.drain:
                    results = await _time_pages_draining(dsn, args)
                else:
                    results = await time_pages(dsn, args.repeat, args.only)
        finally:
            from pgwork.testing.databases import drop_database

            drop_database(admin, name)
            del template
    print(f"| page ({total:,} jobs) | median ms | p95 ms |")
    print("|---|---:|---:|")
    for label, median, p95 in results:
        print(f"| {label} | {median:.1f} | {p95:.1f} |")
    if not results:
        raise SystemExit(f"no page label contains any of {args.only}")
    slowest = max(p95 for _, _, p95 in results)
    print(f"\nslowest p95: {slowest:.1f} ms (target: every page < 150 ms)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    parser.add_argument("--dsn", help="admin DSN of the server (default: embedded PostgreSQL)")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="chains to load")
    parser.add_argument("--repeat", type=int, default=20, help="renders per page")
    parser.add_argument(
        "--drain",
        type=int,
        default=0,
        metavar="N",
        help="time the pages while a worker drains a backlog of N jobs (default: idle)",
    )
    parser.add_argument(
        "--drain-slots", type=int, default=100, help="the draining worker's slots (default 100)"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="time only the pages whose label contains TEXT (repeatable)",
    )
    args: Any = parser.parse_args(argv)
    return anyio.run(_run, args)


if __name__ == "__main__":
    raise SystemExit(main())
