"""``python -m bench.turns`` keeps working: both loops complete every job they were given,
and the WAL they wrote can always be read back.

No figure is checked (speed is never a test assertion), only that each loop ran to the
end and read its WAL back.
"""

from __future__ import annotations

import re

import psycopg
import pytest

from bench.tests._runs import needs_walinspect, run_bench
from bench.turns import flush_to


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_turn_and_the_writes_alone_each_drain_the_queue(pg_server_dsn: str) -> None:
    needs_walinspect(pg_server_dsn)
    out = run_bench("bench.turns", pg_server_dsn, "--jobs", "600", "--batch", "50", "--repeat", "1")
    for name in ("pgwork's turn", "the writes alone"):
        [line] = [x for x in out.splitlines() if x.startswith(f"{name}, turns of 50")]
        wal = re.search(r"WAL ([\d,]+) B/job", line)
        assert wal is not None, line
        assert int(wal.group(1).replace(",", "")) > 0, line
        assert line.endswith(", 0 unfinished"), line


@pytest.mark.anyio
async def test_the_wal_a_run_ends_on_is_flushed_even_when_no_commit_follows_it(
    pg_server_dsn: str,
) -> None:
    # A record with no commit after it (here a non-transactional message; in a run, a
    # page pruned by the last scan) stays in memory until the WAL writer, asleep on an
    # idle server, gets to it: CI once waited 5 s for it in vain.
    async with await psycopg.AsyncConnection.connect(pg_server_dsn, autocommit=True) as probe:
        cur = await probe.execute(
            "SELECT pg_logical_emit_message(false, 'pgwork-test', 'x')::text,"
            " pg_current_wal_insert_lsn()::text"
        )
        [(_, end)] = await cur.fetchall()
        await flush_to(probe, end)
        cur = await probe.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (end,))
        assert await cur.fetchone() == (True,)
