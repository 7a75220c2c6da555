"""``python -m bench.indexes`` keeps working, and attributes WAL to the right index.

No figure is checked (speed is never a test assertion): only that each phase ran and
that the WAL it reads back per relation shows what the schema says. A one-job chain
writes nothing into jobs_chain_idx, whose entries are continuations only; the drain
writes into jobs_lease_expiry_idx (a claimed job enters its predicate), the enqueue
does not.
"""

from __future__ import annotations

import pytest

from bench.tests._runs import needs_walinspect, run_bench


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
    needs_walinspect(pg_server_dsn)
    out = run_bench(
        "bench.indexes",
        pg_server_dsn,
        "--jobs",
        "300",
        "--renewals",
        "50",
        "--variants",
        "head/-jobs_chains_idx",
    )
    enqueue, drain, renew = (_phase(out, name) for name in ("enqueue", "drain", "renew"))

    for index in ("jobs_pkey", "jobs_acquire_idx", "jobs_chains_idx"):
        assert f"    {index} " in enqueue, enqueue
    assert "jobs_chain_idx " not in enqueue + drain + renew
    assert "jobs_lease_expiry_idx " not in enqueue
    assert "jobs_lease_expiry_idx " in drain
    assert "(0 HOT)" in drain
    # A running root is not in the chains index (migration 0006): its lease renewals
    # write no entry there; its completion does.
    assert "jobs_chains_idx " in drain
    assert "jobs_chains_idx " not in renew, renew
    assert "jobs_created_idx" not in out
    assert "== -jobs_chains_idx" in out
    dropped = out.split("== -jobs_chains_idx", 1)[1]
    assert "jobs_chains_idx " not in dropped.split("sizes after")[0]
