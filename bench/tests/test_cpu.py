"""``python -m bench.cpu``: its enqueue yardstick, the bare multi-row INSERT it compares
``start_chains`` of 100 with, writes the very rows ``start_chains`` writes; its rows
keep working (the enqueue rows, the sync handlers' drain beside the async one).

Batched enqueue is held to a multi-row INSERT of the same rows; the benchmark's raw
floor inserts four-column rows into a table of its own, so
``bench.cpu`` and ``python -m bench --peers`` (the column "raw SQL, pgwork's rows") also
measure a bare INSERT into pgwork's own table (``bench/peers/_peer_common.py``). It is
only that yardstick if every column it leaves to the defaults, and every one it writes,
comes out as ``start_chains`` has it (ids and clocks aside), and its ids are
time-ordered as pgwork's are.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from bench._pgwork_app import Item, open_client
from bench.peers._peer_common import pgwork_rows_insert, pgwork_rows_params
from bench.tests._runs import run_bench
from pgwork import ChainStart

# Differ from row to row whoever writes them: ids, and the clock at the insert.
_OWN = {"id", "chain_id", "created_at", "scheduled_at", "input"}


async def _rows(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    cur = await conn.execute("SELECT * FROM pgwork.jobs ORDER BY input->>'n'")
    names = [d.name for d in cur.description or []]
    rows = [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]
    await conn.execute("DELETE FROM pgwork.jobs")
    await conn.commit()
    return rows


@pytest.mark.anyio
async def test_the_bare_insert_writes_the_rows_start_chains_writes(pgwork_dsn: str) -> None:
    async with (
        open_client(pgwork_dsn, pool_size=1) as client,
        await psycopg.AsyncConnection.connect(pgwork_dsn) as conn,
    ):
        noop = client.registry.get("noop")
        await client.start_chains(conn, [ChainStart(noop, Item(n=k)) for k in range(100)])
        await conn.commit()
        pgwork = await _rows(conn)
        await conn.execute(pgwork_rows_insert(100), pgwork_rows_params(range(100)))
        await conn.commit()
        bare = await _rows(conn)
    assert len(pgwork) == len(bare) == 100
    for rows in (pgwork, bare):  # time-ordered, in the order they were made
        ids = [row["id"] for row in sorted(rows, key=lambda row: row["input"]["n"])]
        assert {job_id.version for job_id in ids} == {7}
        assert ids == sorted(ids)
    for ours, theirs in zip(pgwork, bare, strict=True):
        assert ours["input"] == theirs["input"]
        assert ours["id"] == ours["chain_id"]
        assert theirs["id"] == theirs["chain_id"]
        assert {k: v for k, v in ours.items() if k not in _OWN} == {
            k: v for k, v in theirs.items() if k not in _OWN
        }


@pytest.mark.timeout(300)
def test_the_enqueue_rows_print_each_yardstick(pg_server_dsn: str) -> None:
    out = run_bench(
        "bench.cpu",
        pg_server_dsn,
        "--only",
        "enqueue",
        "--enqueue-jobs",
        "100",
        "--enqueue-batch-jobs",
        "1000",
    )
    for name in (
        "start_chain + commit",
        "INSERT + COMMIT",
        "start_chains(100) + commit",
        "INSERT of 100 rows + COMMIT",
        "INSERT of 100 pgwork rows + COMMIT",
    ):
        assert f"enqueue, {name}: " in out, out


@pytest.mark.timeout(300)
def test_the_sync_drain_prints_its_row_and_its_ratio_to_the_async_drain(
    pg_server_dsn: str,
) -> None:
    out = run_bench("bench.cpu", pg_server_dsn, "--only", "drain,sync", "--jobs", "1500")
    assert "drain, 1 worker x 10 slots: " in out, out
    assert "drain, 1 worker x 10 slots, sync handlers on 10 threads: " in out, out
    assert "sync / async drain: " in out, out
    assert "limited / plain" not in out, out
