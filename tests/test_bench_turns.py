"""``python -m bench.turns`` keeps working: both loops complete every job they were given.

No figure is checked (speed is never a test assertion), only that each loop ran to the
end and read its WAL back.
"""

from __future__ import annotations

import re

import pytest

from _bench_runs import needs_walinspect, run_bench


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
