"""The benchmark's cost rows (bench/_cost.py) read what they claim: the library
process's CPU, the CPU of the backends of the run's database and of no other, and the
transaction ids of what wrote, not of the reads; and the table puts them under their row.

Figures are compared with work done on purpose inside the interval, never with a
speed target.
"""

from __future__ import annotations

import asyncio
import os
import time

import psycopg
import pytest

from bench._cost import CostMeter, _run_time, backends_cpu
from bench._env import fresh_database
from bench._report import Cost, Measurement, render_markdown

# Server work of a few hundred milliseconds in one backend.
BUSY = "SELECT count(*) FROM generate_series(1, 3000000) AS g WHERE g % 7 = 3"


WRITES_AND_READS = "; ".join(
    f"BEGIN; INSERT INTO t VALUES ({n}); COMMIT; SELECT count(*) FROM t" for n in range(40)
).encode()


def _server_local(dsn: str) -> bool:
    name = psycopg.conninfo.conninfo_to_dict(dsn).get("dbname", "postgres")
    with psycopg.connect(dsn):
        return bool(backends_cpu(str(name)))


@pytest.mark.anyio
async def test_the_library_cpu_is_the_process_own_time(pg_server_dsn: str) -> None:
    meter = CostMeter(os.getpid(), pg_server_dsn, pg_server_dsn)
    await meter.open()
    clock = time.process_time()
    while time.process_time() - clock < 0.3:
        pass
    spent = time.process_time() - clock
    await meter.close()
    cost = meter.per_job(1)
    assert cost is not None
    assert abs(cost.library_us / 1e6 - spent) < 0.08


@pytest.mark.anyio
async def test_the_server_cpu_is_the_runs_databases_backends_only(pg_server_dsn: str) -> None:
    if not _server_local(pg_server_dsn):
        pytest.skip("the server's processes are not on this machine")
    with fresh_database(pg_server_dsn) as dsn, fresh_database(pg_server_dsn) as other:
        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as ours,
            await psycopg.AsyncConnection.connect(other, autocommit=True) as theirs,
        ):
            row = await (await ours.execute("SELECT pg_backend_pid()")).fetchone()
            assert row is not None
            meter = CostMeter(os.getpid(), dsn, pg_server_dsn)
            await meter.connect()
            before = _run_time(row[0])
            await meter.open()
            # Control: a backend of another database working as hard counts nothing.
            await theirs.execute(BUSY)
            await theirs.execute(BUSY)
            await ours.execute(BUSY)
            await meter.close()
            after = _run_time(row[0])
    cost = meter.per_job(1)
    assert cost is not None
    assert cost.server_us is not None
    assert before is not None
    assert after is not None
    # What our one backend ran (its own clock, read by pid), not three statements' worth.
    ours_ran = after - before
    assert ours_ran > 0.05
    assert abs(cost.server_us / 1e6 - ours_ran) < 0.2 * ours_ran + 0.01


@pytest.mark.anyio
async def test_a_backend_that_ends_before_the_reading_keeps_what_it_ran(
    pg_server_dsn: str,
) -> None:
    """A runner closes its connections right after its result: the backend's CPU read
    while it lived still counts."""
    if not _server_local(pg_server_dsn):
        pytest.skip("the server's processes are not on this machine")
    with fresh_database(pg_server_dsn) as dsn:
        meter = CostMeter(os.getpid(), dsn, pg_server_dsn)
        await meter.connect()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
            assert row is not None
            before = _run_time(row[0])
            await meter.open()
            await conn.execute(BUSY)
            after = _run_time(row[0])
            await asyncio.sleep(0.05)  # the meter reads its processes every 10 ms
        await asyncio.sleep(0.05)  # the backend is gone
        await meter.close()
    cost = meter.per_job(1)
    assert cost is not None
    assert cost.server_us is not None
    assert before is not None
    assert after is not None
    assert after - before > 0.05
    assert cost.server_us / 1e6 > 0.8 * (after - before)


@pytest.mark.anyio
async def test_transactions_that_wrote_are_counted_and_reads_are_not(pg_server_dsn: str) -> None:
    """Ids are counted server-wide, so another session writing at the same time (on a
    shared test server) can only add to the count, never take from it: every try
    counts all 40 writes, and the least of a few tries is near 40, not the 80 that
    counting the reads too would give. The WAL is server-wide too: likewise."""
    counts, wal = [], []
    with fresh_database(pg_server_dsn) as dsn:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("CREATE TABLE t (n int)")
            # Commits that do not wait for the disk: the window stays a few milliseconds.
            await conn.execute("SET synchronous_commit TO off")
            for _ in range(10):
                meter = CostMeter(os.getpid(), dsn, pg_server_dsn)
                await meter.open()
                # 40 transactions that write, each followed by a read (the control: it
                # takes no id), in one simple query: a window of a few milliseconds.
                await conn.execute(WRITES_AND_READS, prepare=False)
                await meter.close()
                cost = meter.per_job(40)
                assert cost is not None
                counts.append(cost.writes)
                wal.append(cost.wal_bytes)
                assert cost.writes >= 1.0  # every write counted
                if cost.writes == 1.0 and cost.wal_bytes < 1000:
                    break  # a try no other session wrote during (they only add)
    assert min(counts) < 1.25, counts
    # A row and a commit record each (a full-page image at most, after a checkpoint).
    assert 50 < min(wal) < 1000, wal


def test_cost_rows_go_under_their_row_and_compare_like_with_like() -> None:
    from bench._env import Environment

    env = Environment(
        postgres="15",
        server_kind="test",
        settings={},
        cpu="cpu",
        cores=2,
        ram_gib=1.0,
        python="3.11",
        platform="linux",
        pgwork="0",
        started="now",
    )
    best = "drain, best setting"
    atomic = "drain, best setting, atomic groups of 32"
    table = render_markdown(
        env,
        [
            Measurement(best, "pgwork", 100.0, "jobs/s", cost=Cost(40.0, 35.0, 0.05, 1088.0)),
            Measurement(atomic, "pgwork", 20.0, "jobs/s", cost=Cost(300.0, 270.0, 0.1)),
            Measurement(
                best, "pgqueuer-asyncpg", 90.0, "jobs/s", cost=Cost(30.0, 50.0, 0.02, 544.0)
            ),
        ],
    )
    lines = table.splitlines()
    cpu = next(i for i, line in enumerate(lines) if line.startswith(f"| {best}: CPU per job"))
    assert lines[cpu - 1].startswith(f"| {best} |")
    assert "| 75.0 µs (40 + 35) | 80.0 µs (30 + 50) | 1.07x (PgQueuer (asyncpg)) |" in lines[cpu]
    writes = lines[cpu + 1]
    assert writes.startswith(f"| {best}: transaction ids taken, per job |")
    assert "0.40x (PgQueuer (asyncpg))" in writes  # fewer is better: 0.02 / 0.05
    wal = lines[cpu + 2]
    assert wal.startswith(f"| {best}: WAL per job | 1,088 B | 544 B | 0.50x (PgQueuer (asyncpg)) |")
    # The atomic drain's cost compares with the peers' staged drain's, as its speed does.
    atomic_cpu = next(line for line in lines if line.startswith(f"| {atomic}: CPU per job"))
    assert "0.14x (PgQueuer (asyncpg))" in atomic_cpu  # 80 / 570


def test_the_floors_are_no_peers_and_each_has_its_ratio_column() -> None:
    """The floor and the floor's insert of pgwork's rows are ceilings, not peers: neither
    is ever "best peer", and pgwork's figure gets a share of each where it ran."""
    from bench._env import Environment

    env = Environment(
        postgres="15",
        server_kind="test",
        settings={},
        cpu="cpu",
        cores=2,
        ram_gib=1.0,
        python="3.11",
        platform="linux",
        pgwork="0",
        started="now",
    )
    batch = "enqueue, batches of 100"
    drain = "drain, best setting"
    table = render_markdown(
        env,
        [
            Measurement(batch, "pgwork", 300.0, "jobs/s"),
            Measurement(batch, "pgqueuer-asyncpg", 200.0, "jobs/s"),
            Measurement(batch, "raw", 1000.0, "jobs/s"),
            Measurement(batch, "raw-rows", 400.0, "jobs/s"),
            Measurement(drain, "pgwork", 100.0, "jobs/s"),
            Measurement(drain, "raw", 400.0, "jobs/s"),
        ],
    )
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| workload"))
    assert header.endswith(
        "| raw SQL floor | raw SQL, pgwork's rows | pgwork vs best peer | pgwork / floor"
        " | pgwork / its rows |"
    )
    assert f"| {batch} | 300 jobs/s | 200 jobs/s | 1,000 jobs/s | 400 jobs/s |" in table
    assert "| 1.50x (PgQueuer (asyncpg)) | 0.30x | 0.75x |" in table
    # Only the enqueue rows have pgwork's rows measured bare: the drain's cell is empty.
    assert next(line for line in lines if line.startswith(f"| {drain} |")).endswith(
        "|  | 0.25x |  |"
    )
