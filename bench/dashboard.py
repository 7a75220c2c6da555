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
from psycopg import sql

from bench._pgwork_app import uuid7_sql

__all__ = ["load_statements", "main"]

# One row per job, in creation order over the last week; ``g`` numbers them (the newest
# is ``jobs - 1``). Status by ``g % 1000``: 1% failed, 0.5% blocked, 0.1% running, 4%
# pending (half of them scheduled for later), 2% cancelled, the rest completed.
_JOBS = f"""
INSERT INTO {{jobs}} (
    id, type_name, chain_id, chain_type_name, chain_index, input, output, status, queue,
    priority, created_at, scheduled_at, started_at, completed_at, attempt, max_attempts,
    last_attempt_error, last_attempt_at, leased_by, leased_until, chain_status,
    chain_completed_at, dedup_key
)
SELECT u, t, u, t, 0,
       jsonb_build_object('n', g, 'email', 'user' || g || '@example.com'),
       CASE WHEN s = 'completed' THEN jsonb_build_object('sent', true) END,
       s::{{job_status}}, q, 0, created, scheduled,
       CASE WHEN s NOT IN ('pending', 'blocked') THEN scheduled END,
       CASE WHEN s IN ('completed', 'failed', 'cancelled') THEN scheduled + interval '2 s' END,
       CASE WHEN s IN ('pending', 'blocked') THEN 0 WHEN s = 'failed' THEN 3 ELSE 1 END,
       3,
       CASE WHEN s = 'failed' THEN jsonb_build_object(
           'type', 'TimeoutError', 'message', 'upstream timed out after 30 s (job ' || g || ')',
           'traceback', 'Traceback (most recent call last):\n  File "app.py", line 1\n')
       END,
       CASE WHEN s NOT IN ('pending', 'blocked') THEN scheduled END,
       CASE WHEN s = 'running' THEN 'bench-worker-' || (g % 4) END,
       CASE WHEN s = 'running' THEN now() + interval '1 minute' END,
       CASE WHEN s IN ('pending', 'running', 'blocked') THEN 'active' ELSE s END
           ::{{chain_status}},
       CASE WHEN s IN ('completed', 'failed', 'cancelled') THEN scheduled + interval '2 s' END,
       CASE WHEN g % 100 = 0 THEN 'key-' || g END
FROM (
    SELECT g, {uuid7_sql("created")} AS u, t, q, s, created,
           CASE WHEN s = 'pending' AND g % 2 = 0 THEN now() + interval '1 hour'
                ELSE created END AS scheduled
    FROM (
        SELECT g,
               'bench.' || (ARRAY['email', 'resize', 'report', 'sync', 'charge', 'export',
                                  'notify', 'index'])[1 + g % 8] AS t,
               (ARRAY['default', 'mail', 'reports', 'slow'])[1 + (g / 7) % 4] AS q,
               CASE WHEN g % 1000 < 10 THEN 'failed'
                    WHEN g % 1000 < 15 THEN 'blocked'
                    WHEN g % 1000 = 15 THEN 'running'
                    WHEN g % 1000 < 56 THEN 'pending'
                    WHEN g % 1000 < 76 THEN 'cancelled'
                    ELSE 'completed' END AS s,
               now() - (%(jobs)s - g) * (interval '7 days' / %(jobs)s) AS created
        FROM generate_series(0, %(jobs)s - 1) AS g
    ) AS numbered
) AS rows
"""

# A second job for one completed chain in ten (its continuation, completed too).
_CONTINUATIONS = f"""
INSERT INTO {{jobs}} (
    id, type_name, chain_id, chain_type_name, chain_index, input, output, status, queue,
    created_at, scheduled_at, started_at, completed_at, attempt, max_attempts
)
SELECT {uuid7_sql("r.created_at + interval '1 s'")}, r.type_name || '.next', r.id,
       r.type_name, 1, '{{{{}}}}',
       '{{{{"done": true}}}}', 'completed', r.queue, r.created_at + interval '1 s',
       r.created_at + interval '1 s', r.created_at + interval '1 s', r.completed_at, 1, 3
FROM {{jobs}} AS r
WHERE r.status = 'completed' AND r.chain_index = 0 AND get_byte(uuid_send(r.id), 15) < 26
"""

# Each blocked job waits for one pending chain.
_BLOCKERS = """
INSERT INTO {job_blockers} (job_id, blocker_chain_id, position)
SELECT d.id, b.id, 0
FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {jobs}
      WHERE status = 'blocked') AS d
JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {jobs}
      WHERE status = 'pending' AND chain_index = 0) AS b ON b.n = d.n
"""

_WORKERS = """
INSERT INTO {workers} (id, host, pid, queues, job_types, max_slots, active_slots, status,
                       started_at, heartbeat_at)
SELECT 'bench-worker-' || w, 'host-' || (w % 2), 1000 + w, ARRAY['default', 'mail'],
       ARRAY['bench.email'], 16, w % 16, CASE WHEN w < 4 THEN 'busy' ELSE 'stopped' END,
       now() - interval '2 hours', CASE WHEN w < 4 THEN now() ELSE now() - interval '1 hour' END
FROM generate_series(0, 5) AS w
"""


def load_statements(*, jobs: int, schema: str = "pgwork") -> list[sql.Composed]:
    """The statements that fill ``schema`` with ``jobs`` jobs (plus continuations,
    blocker edges and workers), ready for ``execute`` on an autocommit connection."""
    names = {
        "jobs": sql.Identifier(schema, "jobs"),
        "job_blockers": sql.Identifier(schema, "job_blockers"),
        "workers": sql.Identifier(schema, "workers"),
        "job_status": sql.Identifier(schema, "job_status"),
        "chain_status": sql.Identifier(schema, "chain_status"),
    }
    count = sql.Literal(jobs)
    return [
        sql.SQL(_JOBS.replace("%(jobs)s", "{count}")).format(count=count, **names),
        sql.SQL(_CONTINUATIONS).format(**names),
        sql.SQL(_BLOCKERS).format(**names),
        sql.SQL(_WORKERS).format(**names),
        sql.SQL("VACUUM (ANALYZE) {jobs}").format(**names),
        sql.SQL("VACUUM (ANALYZE) {job_blockers}").format(**names),
    ]


async def _ids(dsn: str) -> dict[str, str]:
    """Ids of rows worth opening: a two-job chain, a failed job, a blocked chain."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        picks = {
            "chain": "SELECT chain_id FROM pgwork.jobs WHERE chain_index = 1 LIMIT 1",
            "failed": "SELECT id FROM pgwork.jobs WHERE status = 'failed' LIMIT 1",
            "blocked": "SELECT chain_id FROM pgwork.jobs WHERE status = 'blocked' LIMIT 1",
            "key": "SELECT dedup_key FROM pgwork.jobs WHERE dedup_key IS NOT NULL LIMIT 1",
            "newest_email": "SELECT input ->> 'n' FROM pgwork.jobs"
            " WHERE type_name = 'bench.email' AND chain_index = 0 ORDER BY id DESC LIMIT 1",
        }
        found = {}
        for name, query in picks.items():
            row = await (await conn.execute(query)).fetchone()
            assert row is not None, name
            found[name] = str(row[0])
        return found


async def _time_pages(dsn: str, repeat: int, only: list[str]) -> list[tuple[str, float, float]]:
    from pgwork import PostgresStateAdapter, create_client
    from pgwork.dashboard import allow_any, create_dashboard
    from pgwork.job_types import JobTypeRegistry

    ids = await _ids(dsn)
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
            first = (await http.get("/chains")).text
            cursor = first.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
            failed = (await http.get("/failed")).text
            failed_next = failed.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
            pages = {
                "overview `/`": "/",
                "chains `/chains`": "/chains",
                "chains, next page": cursor.replace("&amp;", "&"),
                "chains by status (failed)": "/chains?status=failed",
                "chains by type": "/chains?type=bench.email",
                "chains by queue": "/chains?queue=mail",
                "chains by dedup key": f"/chains?q={ids['key']}",
                "chain `/chains/{id}`": f"/chains/{ids['chain']}",
                "blocked chain": f"/chains/{ids['blocked']}",
                "job `/jobs/{id}`": f"/jobs/{ids['failed']}",
                "workers `/workers`": "/workers",
                "failed `/failed`": "/failed",
                "failed, next page": failed_next.replace("&amp;", "&"),
                "queues `/queues`": "/queues",
                "ready jobs `/jobs`": "/jobs?status=ready",
                "ready jobs of a queue": "/jobs?status=ready&queue=mail",
                "scheduled jobs": "/jobs?status=scheduled",
                "running jobs": "/jobs?status=running",
                "failed jobs, newest": "/jobs?status=failed&order=newest",
                "errors `/errors`": "/errors",
                "search by id prefix": f"/search?id={ids['failed'][:6]}",
                "search by input field (a match among the newest)": (
                    "/search?type=bench.email&field=email&value=%22user%40example.com%22".replace(
                        "user", f"user{ids['newest_email']}"
                    )
                ),
                "search by input field (none of 10,000 match)": (
                    "/search?type=bench.email&field=email&value=%22nobody%40example.com%22"
                ),
                "history, last day `/history`": "/history",
                "history, last week": "/history?window=7d",
                "history, 90 days": "/history?window=90d",
                "history of a queue and type": "/history?queue=mail&type=bench.email",
            }
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
        results = await _time_pages(dsn, args.repeat, args.only)
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
                    for statement in load_statements(jobs=args.jobs):
                        conn.execute(statement)
                    row = conn.execute("SELECT count(*) FROM pgwork.jobs").fetchone()
                loaded = time.perf_counter() - started
                total = row[0] if row else 0
                print(f"loaded {total:,} jobs ({args.jobs:,} chains) in {loaded:.1f} s\n")
                if args.drain:
                    results = await _time_pages_draining(dsn, args)
                else:
                    results = await _time_pages(dsn, args.repeat, args.only)
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
