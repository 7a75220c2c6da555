"""The benchmark's cost rows (bench/_cost.py) read what they claim: the library
process's CPU, the CPU of the backends of the run's database and of no other, and the
transaction ids of what wrote, not of the reads; and the table puts them under their row.

Figures are compared with work done on purpose inside the interval, never with a
speed target.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._cost import CostMeter, backends_cpu  # noqa: E402
from bench._env import fresh_database  # noqa: E402
from bench._report import Cost, Measurement, render_markdown  # noqa: E402

# Server work of a few hundred milliseconds in one backend.
BUSY = "SELECT count(*) FROM generate_series(1, 3000000) AS g WHERE g % 7 = 3"


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
            meter = CostMeter(os.getpid(), dsn, pg_server_dsn)
            await meter.connect()
            await meter.open()
            # Control: a backend of another database working as hard counts nothing.
            await theirs.execute(BUSY)
            await theirs.execute(BUSY)
            alone = time.perf_counter()
            await ours.execute(BUSY)
            ours_wall = time.perf_counter() - alone
            await meter.close()
    cost = meter.per_job(1)
    assert cost is not None
    assert cost.server_us is not None
    # Our backend ran for (nearly) its statement's wall time, not for three statements.
    assert 0.5 * ours_wall < cost.server_us / 1e6 < 1.5 * ours_wall + 0.02


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
            await meter.open()
            began = time.perf_counter()
            await conn.execute(BUSY)
            wall = time.perf_counter() - began
            await asyncio.sleep(0.05)  # the meter reads its processes every 10 ms
        await asyncio.sleep(0.05)  # the backend is gone
        await meter.close()
    cost = meter.per_job(1)
    assert cost is not None
    assert cost.server_us is not None
    assert cost.server_us / 1e6 > 0.5 * wall


@pytest.mark.anyio
async def test_transactions_that_wrote_are_counted_and_reads_are_not(pg_server_dsn: str) -> None:
    with fresh_database(pg_server_dsn) as dsn:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("CREATE TABLE t (n int)")
            meter = CostMeter(os.getpid(), dsn, pg_server_dsn)
            await meter.open()
            for n in range(40):
                await conn.execute("INSERT INTO t VALUES (%s)", (n,))
                await conn.execute("SELECT count(*) FROM t")  # control: takes no id
            await meter.close()
    cost = meter.per_job(40)
    assert cost is not None
    # 40 writes; nothing else writes on the test server meanwhile but a straggler.
    assert 1.0 <= cost.writes <= 1.1


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
            Measurement(best, "pgwork", 100.0, "jobs/s", cost=Cost(40.0, 35.0, 0.05)),
            Measurement(atomic, "pgwork", 20.0, "jobs/s", cost=Cost(300.0, 270.0, 0.1)),
            Measurement(best, "pgqueuer-asyncpg", 90.0, "jobs/s", cost=Cost(30.0, 50.0, 0.02)),
        ],
    )
    lines = table.splitlines()
    cpu = next(i for i, line in enumerate(lines) if line.startswith(f"| {best}: CPU per job"))
    assert lines[cpu - 1].startswith(f"| {best} |")
    assert "| 75.0 µs (40 + 35) | 80.0 µs (30 + 50) | 1.07x (PgQueuer (asyncpg)) |" in lines[cpu]
    writes = lines[cpu + 1]
    assert writes.startswith(f"| {best}: transaction ids taken, per job |")
    assert "0.40x (PgQueuer (asyncpg))" in writes  # fewer is better: 0.02 / 0.05
    # The atomic drain's cost compares with the peers' staged drain's, as its speed does.
    atomic_cpu = next(line for line in lines if line.startswith(f"| {atomic}: CPU per job"))
    assert "0.14x (PgQueuer (asyncpg))" in atomic_cpu  # 80 / 570
