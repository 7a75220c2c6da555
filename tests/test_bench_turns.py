"""``python -m bench.turns`` keeps working: both loops complete every job they were given.

No figure is checked (speed is never a test assertion), only that each loop ran to the
end and read its WAL back.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_turn_and_the_writes_alone_each_drain_the_queue(pg_server_dsn: str) -> None:
    with psycopg.connect(pg_server_dsn) as conn:
        available = conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'"
        ).fetchone()
    if available is None:
        pytest.skip("pg_walinspect is not installed on this server")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.turns",
            "--dsn",
            pg_server_dsn,
            "--jobs",
            "600",
            "--batch",
            "50",
            "--repeat",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("pgwork's turn", "the writes alone"):
        [line] = [x for x in done.stdout.splitlines() if x.startswith(f"{name}, turns of 50")]
        wal = re.search(r"WAL ([\d,]+) B/job", line)
        assert wal is not None, line
        assert int(wal.group(1).replace(",", "")) > 0, line
        assert line.endswith(", 0 unfinished"), line
