"""``python -m bench.indexes`` keeps working, and attributes WAL to the right index.

No figure is checked (speed is never a test assertion): only that each phase ran and
that the WAL it reads back per relation shows what the schema says. A one-job chain
writes nothing into jobs_chain_idx, whose entries are continuations only; the drain
writes into jobs_lease_expiry_idx (a claimed job enters its predicate), the enqueue
does not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[1]


def _phase(output: str, name: str) -> str:
    """The lines of phase ``name`` of the first variant."""
    lines = output.split(f"\n{name}:", 1)[1].split("\n")
    block = [lines[0]]
    for line in lines[1:]:
        if not line.startswith("    "):
            break
        block.append(line)
    return "\n".join(block)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_phase_reports_the_wal_of_the_indexes_it_wrote(pg_server_dsn: str) -> None:
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
            "bench.indexes",
            "--dsn",
            pg_server_dsn,
            "--jobs",
            "300",
            "--renewals",
            "50",
            "--variants",
            "head/-jobs_created_idx",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    enqueue, drain, renew = (_phase(out, name) for name in ("enqueue", "drain", "renew"))

    for index in ("jobs_pkey", "jobs_acquire_idx", "jobs_chains_idx", "jobs_created_idx"):
        assert f"    {index} " in enqueue, enqueue
    assert "jobs_chain_idx " not in enqueue + drain + renew
    assert "jobs_lease_expiry_idx " not in enqueue
    assert "jobs_lease_expiry_idx " in drain
    assert "(0 HOT)" in drain
    assert "== -jobs_created_idx" in out
    dropped = out.split("== -jobs_created_idx", 1)[1]
    assert "jobs_created_idx " not in dropped.split("sizes after")[0]
