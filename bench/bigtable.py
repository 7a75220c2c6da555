"""pgwork at big-table scale: millions of finished jobs, and what they cost the rest.

    python -m bench.bigtable --dsn DSN [--finished 10000000] [--churn 0.2]
        [--ready 100000] [--slots 50] [--repeat 3] [--runs 20]
        [--cleanup vacuum|autovacuum] [--json FILE]

On the server of ``--dsn`` (default: ``PGWORK_BENCH_DSN``, else an embedded
PostgreSQL) it migrates a database with pgwork's own migrations (a template, cloned
into the big table's database and into an empty one for each comparison drain, all
dropped at the end), then:

1. **The big table.** Loads about ``--finished`` finished jobs as a steady state
   leaves them under pgwork's default retention (bench/_bigtable_load.py: completed
   chains of the last day, failed and cancelled ones of the last week, one retention
   batch past due; multi-step chains, thirty types on ten queues), set-based, in
   creation order; vacuums and analyzes; rolls the history up as the workers keep it;
   then a day's churn (``--churn``: that share of the jobs deleted as retention deletes
   expired chains, as many moved to running and back) and a ``VACUUM`` (or, with
   ``--cleanup autovacuum``, waits for autovacuum). Sizes of every table and index
   after each step.
2. **Acquire rate.** ``--ready`` ready no-op jobs drained by one worker process of
   ``--slots`` slots, on the big table and on an empty one, ``--repeat`` times each,
   taking turns; the median rates and their ratio (target: 0.90 or more).
3. **Statements.** The reaper's, the lease renewal's, the heartbeat's, the acquire's and
   the retention sweep's batch, pgwork's own text and parameters, timed on the big
   table (bench/_bigtable_statements.py), from which the drains' jobs were deleted
   first (one type in one queue at the newest end of the primary key, they would make
   every listing filtered on another read past them all).
4. **Pages.** Every dashboard page (bench/dashboard.py's list) and ``pgwork jobs list``
   (the client call it makes, and the whole command as a process), median and p95 ms
   against 150 ms.
5. **Vacuum.** Dead tuples before and after, and the time of a ``VACUUM`` of jobs after
   the churn, after one drain and with nothing to clean; autovacuum's runs during each
   drain; the tables' storage settings; how often jobs' own autovacuum scale factor
   would start a vacuum at the drain's pace.

The report (markdown, a table per section, headed by the command and the commit) goes
to stdout, progress to stderr; ``--json FILE`` writes every figure too. At the
default size the load takes a while (about a minute per million jobs on 2 cores):
try ``--finished 200000`` first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import psycopg
from psycopg import sql

from bench._bigtable_load import TYPES, Timeline, churn, load
from bench._bigtable_probe import relation_sizes, reloptions, settle_stats, table_stats, vacuum
from bench._bigtable_report import BigTableRun, DrainRun, Timed, render_markdown
from bench._bigtable_statements import prepare, time_statements
from bench._env import describe_environment, fresh_database, server
from bench._loop import LOOPS, resolve, run
from bench._pgwork_app import SCHEMA, bulk_load, settle
from bench._plan import percentile
from bench._worker_process import WorkerProcess
from pgwork.adapters.history import HISTORY_KEEP, HISTORY_MAX_LAG
from pgwork.testing.databases import create_migrated_database, drop_database, unique_database_name

__all__ = ["main"]

REPO_ROOT = Path(__file__).resolve().parents[1]
# The busy type and its queue the dashboard's filtered pages and listings use.
PAGE_TYPE = TYPES[0][1]
PAGE_QUEUE = TYPES[0][0]
# Jobs one history rollup step counts: the table's whole past in a few transactions.
ROLLUP_STEP = 1_000_000
DRAIN_LIMIT_S = 1800.0
AUTOVACUUM_LIMIT_S = 3600.0
# ``pgwork jobs list`` as a process: runs after one that warms the disk cache.
COMMAND_RUNS = 5

_JOBS = sql.Identifier(SCHEMA, "jobs")
_NOOP_LEFT = sql.SQL(
    "SELECT count(*) FROM {} WHERE status IN ('pending', 'running') AND type_name = 'noop'"
).format(_JOBS)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- 1. the big table ----------------------------------------------------------------


def _autovacuum_off(dsn: str, off: bool) -> None:
    """Keep autovacuum off jobs while the bench loads and churns it (``off``), or give
    the table back its own settings."""
    change = "SET (autovacuum_enabled = off)" if off else "RESET (autovacuum_enabled)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} " + change).format(_JOBS))


async def _roll_up(dsn: str) -> int:
    """Count the table's ended jobs into the history, as the workers' maintenance does,
    a larger batch a step; the steps taken."""
    from pgwork import PostgresStateAdapter

    state = await PostgresStateAdapter.connect(dsn, schema=SCHEMA, max_size=1)
    steps = 0
    try:
        while True:
            steps += 1
            step = await state.roll_up_history(
                limit=ROLLUP_STEP, keep=HISTORY_KEEP, max_lag=HISTORY_MAX_LAG
            )
            if step.caught_up:
                return steps
    finally:
        await state.close()


async def _wait_for_autovacuum(dsn: str, before: int) -> float:
    started = time.perf_counter()
    while table_stats(dsn).autovacuums <= before:
        if time.perf_counter() - started > AUTOVACUUM_LIMIT_S:
            raise TimeoutError(f"autovacuum did not vacuum jobs in {AUTOVACUUM_LIMIT_S:.0f} s")
        await anyio.sleep(5)
    return time.perf_counter() - started


async def big_table(dsn: str, result: BigTableRun, fraction: float) -> None:
    if result.cleanup == "vacuum":
        _autovacuum_off(dsn, True)
    t = result.timeline
    say(f"loading about {t.finished:,} finished jobs (+ {fraction:.0%} to churn)")

    def progress(done: int, total: int) -> None:
        if done * 10 // total > (done - 1) * 10 // total:
            say(f"  load: chunk {done} of {total}")

    result.load = load(dsn, t, on_chunk=progress)
    say(f"loaded {result.load.jobs:,} jobs in {result.load.seconds:,.1f} s; vacuuming")
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(_JOBS))
    result.load_vacuum_s = time.perf_counter() - started
    started = time.perf_counter()
    result.rollup_steps = await _roll_up(dsn)
    result.rollup_s = time.perf_counter() - started
    result.sizes["after load"] = relation_sizes(dsn)
    say(f"history rolled up in {result.rollup_s:,.1f} s; churning")
    result.churn = churn(dsn, t, fraction)
    await settle_stats()
    result.stats_after_churn = table_stats(dsn)
    result.sizes["after churn"] = relation_sizes(dsn)
    say(f"churned in {result.churn.seconds:,.1f} s: {result.stats_after_churn.dead:,} dead")
    if result.cleanup == "autovacuum":
        result.autovacuum_wait_s = await _wait_for_autovacuum(
            dsn, result.stats_after_churn.autovacuums
        )
        result.vacuums["after the churn"] = await vacuum(dsn)
    else:
        result.vacuums["after the churn"] = await vacuum(dsn, analyze=True)
        _autovacuum_off(dsn, False)
    result.sizes["after VACUUM"] = relation_sizes(dsn)
    result.vacuums["with nothing to clean"] = await vacuum(dsn)
    say(f"vacuumed in {result.vacuums['after the churn'].seconds:,.1f} s")


# --- 2. acquire rate -----------------------------------------------------------------


async def _drained(dsn: str) -> float:
    """Wait until no no-op job is pending or running (the big table's own pending jobs
    are of other types); the ``time.time()`` it was seen."""
    deadline = time.monotonic() + DRAIN_LIMIT_S
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            row = await (await conn.execute(_NOOP_LEFT)).fetchone()
            if row is not None and row[0] == 0:
                return time.time()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no-op jobs still outstanding after {DRAIN_LIMIT_S:.0f} s")
            await anyio.sleep(0.01)


async def drain(dsn: str, table: str, index: int, jobs: int, slots: int) -> DrainRun:
    """Load ``jobs`` ready no-op jobs, settle the table, drain them with one worker
    process of ``slots`` slots; timed from its first handler start."""
    await bulk_load(dsn, jobs)
    started = time.perf_counter()
    await settle(dsn)
    settled = time.perf_counter() - started
    await settle_stats()
    before = table_stats(dsn)
    worker = await WorkerProcess.start(dsn, slots=slots, target=jobs)
    try:
        await worker.go()
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while worker.count < jobs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the worker handled {worker.count:,} of {jobs:,} jobs")
            await anyio.sleep(0.005)
        finished = await _drained(dsn)
    finally:
        await worker.stop()
    if worker.first is None:
        raise RuntimeError("the worker reported no first handler start")
    await settle_stats()
    changes = table_stats(dsn).since(before)
    return DrainRun(table, index, jobs, finished - worker.first, settled, changes)


async def acquire_rates(
    admin: str, template: str, big: str, result: BigTableRun, args: argparse.Namespace
) -> None:
    for index in range(args.repeat):
        for table in ("empty", "big") if index % 2 == 0 else ("big", "empty"):
            if table == "empty":
                with fresh_database(admin, template=template) as dsn:
                    done = await drain(dsn, table, index, args.ready, args.slots)
            else:
                done = await drain(big, table, index, args.ready, args.slots)
                if "after a drain" not in result.vacuums:
                    result.vacuums["after a drain"] = await vacuum(big)
            result.drains.append(done)
            say(f"drain {index + 1} of {args.repeat}, {table} table: {done.rate:,.0f} jobs/s")
    # The drains' jobs are the bench's: one type in one queue, the newest end of the
    # primary key. Left there, every listing filtered on another type or queue would
    # read past them all; the statements and pages are timed on the steady state.
    with psycopg.connect(big, autocommit=True) as conn:
        conn.execute(sql.SQL("DELETE FROM {} WHERE type_name = 'noop'").format(_JOBS))
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(_JOBS))


# --- 4. pages and the command --------------------------------------------------------


async def pages(dsn: str, result: BigTableRun, runs: int) -> None:
    from bench.dashboard import time_pages

    with contextlib.redirect_stdout(sys.stderr):
        timed = await time_pages(dsn, runs, [], type_name=PAGE_TYPE, queue=PAGE_QUEUE)
    result.pages = [Timed(label, median, p95, runs) for label, median, p95 in timed]


async def jobs_list(dsn: str, result: BigTableRun, runs: int) -> None:
    """``pgwork jobs list``: the client call the command makes (and its filters), in
    this process; then the whole command, a process of its own each time."""
    from pgwork import PostgresStateAdapter, create_client
    from pgwork.job_types import JobTypeRegistry
    from pgwork.records import JobStatus

    state = await PostgresStateAdapter.connect(dsn, schema=SCHEMA, max_size=2)
    client = create_client(state_adapter=state, registry=JobTypeRegistry(), observers=[])
    variants = {
        "`pgwork jobs list`: its query": {},
        "`pgwork jobs list --status failed`: its query": {"status": JobStatus.FAILED},
        f"`pgwork jobs list --queue {PAGE_QUEUE}`: its query": {"queue": PAGE_QUEUE},
        f"`pgwork jobs list --type {PAGE_TYPE}`: its query": {"type_name": PAGE_TYPE},
        f"`pgwork jobs list --type {TYPES[-1][1]}` (a rare type): its query": {
            "type_name": TYPES[-1][1]
        },
    }
    try:
        for label, filters in variants.items():
            took = []
            for index in range(runs + 1):
                started = time.perf_counter()
                await client.list_jobs(limit=50, **filters)
                await client.state.now()
                if index:
                    took.append((time.perf_counter() - started) * 1000)
            result.jobs_list.append(
                Timed(label, statistics.median(took), percentile(took, 95), runs, "limit 50")
            )
    finally:
        await client.close()
    command = [sys.executable, "-m", "pgwork.cli", "jobs", "list", "--dsn", dsn]
    result.jobs_list.append(
        await _process(
            command,
            "`pgwork jobs list`: the whole command",
            "a Python process: start-up, imports, connect, query, print",
        )
    )
    result.jobs_list.append(
        await _process(
            [sys.executable, "-c", "import pgwork.cli"],
            "a Python process that imports pgwork's CLI and exits",
            "the floor under any `pgwork` command on this machine",
        )
    )


async def _process(command: list[str], label: str, note: str) -> Timed:
    """``command`` run ``COMMAND_RUNS`` times after one untimed, each to its exit."""
    took = []
    for index in range(COMMAND_RUNS + 1):
        started = time.perf_counter()
        done = await anyio.run_process(command, check=False, cwd=REPO_ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"{label} failed: {done.stderr.decode()[-2000:]}")
        if index:
            took.append((time.perf_counter() - started) * 1000)
    return Timed(label, statistics.median(took), percentile(took, 95), COMMAND_RUNS, note)


# --- 5. what is left to read ---------------------------------------------------------


def _free_percent(dsn: str) -> float | None:
    """The jobs heap's free space, from ``pgstattuple_approx`` where the extension can
    be created (it reads the pages the visibility map does not vouch for)."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            row = conn.execute(
                "SELECT approx_free_percent FROM pgstattuple_approx(%s::regclass)",
                [f"{SCHEMA}.jobs"],
            ).fetchone()
    except psycopg.Error:
        return None
    return float(row[0]) if row else None


# --- the run -------------------------------------------------------------------------


def _command(argv: Sequence[str]) -> str:
    """The command line as given, a DSN's password hidden."""
    words = ["python", "-m", "bench.bigtable", *argv]
    return re.sub(r"(://[^:/@\s]+):[^@\s]+@", r"\1:***@", " ".join(map(shlex.quote, words)))


async def _run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    timeline = Timeline.plan(args.finished, args.churn)
    with server(args.dsn) as (admin, kind):
        options = {
            "finished": f"{args.finished:,}",
            "churn": f"{args.churn:g}",
            "ready": f"{args.ready:,}",
            "slots": str(args.slots),
            "repeat": str(args.repeat),
            "runs": str(args.runs),
            "cleanup": args.cleanup,
        }
        env = describe_environment(admin, kind, options)
        if args.cleanup == "autovacuum" and env.settings.get("autovacuum") != "on":
            raise SystemExit("--cleanup autovacuum: the server runs with autovacuum off")
        result = BigTableRun(_command(argv), env, timeline, args.cleanup)
        template = unique_database_name("pgwork_bench_big_tpl")
        create_migrated_database(admin, template)
        try:
            with fresh_database(admin, template=template) as big:
                await big_table(big, result, args.churn)
                await acquire_rates(admin, template, big, result, args)
                say("timing statements")
                fixture = await prepare(big)
                result.statements = time_statements(big, fixture, args.runs)
                say("timing pages")
                await pages(big, result, args.runs)
                await jobs_list(big, result, args.runs)
                result.reloptions = reloptions(big)
                result.free_percent = _free_percent(big)
                await settle_stats()
                result.final_stats = table_stats(big)
                result.sizes["at the end"] = relation_sizes(big)
        finally:
            drop_database(admin, template)
    print(render_markdown(result), flush=True)
    if args.json:
        args.json.write_text(result.to_json())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bigtable",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get("PGWORK_BENCH_DSN"),
        help="admin DSN (default: PGWORK_BENCH_DSN, else an embedded PostgreSQL)",
    )
    parser.add_argument(
        "--finished", type=int, default=10_000_000, help="finished jobs in the big table"
    )
    parser.add_argument(
        "--churn",
        type=float,
        default=0.2,
        help="share of the jobs deleted, and as many updated twice, before the VACUUM",
    )
    parser.add_argument("--ready", type=int, default=100_000, help="jobs each drain runs")
    parser.add_argument("--slots", type=int, default=50, help="the draining worker's max_slots")
    parser.add_argument("--repeat", type=int, default=3, help="drains on each table")
    parser.add_argument(
        "--runs", type=int, default=20, help="timed runs of each statement and page"
    )
    parser.add_argument(
        "--cleanup",
        choices=("vacuum", "autovacuum"),
        default="vacuum",
        help="after the churn: the bench's VACUUM, or wait for autovacuum (default vacuum)",
    )
    parser.add_argument("--json", type=Path, help="also write every figure as JSON")
    parser.add_argument(
        "--loop", choices=LOOPS, default="auto", help="the event loop (auto: uvloop if installed)"
    )
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    if args.finished < 1000:
        parser.error("--finished: at least 1,000 jobs")
    if not 0 <= args.churn < 1:
        parser.error("--churn: a share from 0 up to (not including) 1")
    if args.ready < 100 or args.slots < 1 or args.repeat < 1 or args.runs < 1:
        parser.error("--ready 100 or more; --slots, --repeat and --runs 1 or more")
    return run(_run(args, given), resolve(args.loop))


if __name__ == "__main__":
    raise SystemExit(main())
