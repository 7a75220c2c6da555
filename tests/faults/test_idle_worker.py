"""An idle worker process costs almost nothing, and the control build that acquires
again as soon as an acquire comes back empty (the busy-loop of an earlier build)
shows what this test would catch."""

from __future__ import annotations

import os
import time

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tests.faults._db import fetch
from tests.faults._fleet import start_worker
from tests.faults._worker import BROKEN_ENV

pytestmark = pytest.mark.timeout(120)

IDLE_S = 4.0
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _transactions(dsn: str) -> int:
    """Transactions counted in ``dsn``'s database once its backends ended (each flushes
    its counts when it exits), read from another database of the same server."""
    name = conninfo_to_dict(dsn)["dbname"]
    admin = make_conninfo(dsn, dbname="postgres")
    deadline = time.monotonic() + 10
    last = -1
    while time.monotonic() < deadline:
        [(others, count)] = fetch(
            admin,
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = %s),"
            " (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s)",
            name,
            name,
        )
        if others == 0 and count == last:
            return int(count)
        last = count
        time.sleep(0.3)
    raise AssertionError("the transaction count did not settle")


# Transactions an idle worker makes at most in the window, its start and stop included.
IDLE_TRANSACTIONS = 30


@pytest.mark.parametrize("build", ["", "spin"])
def test_an_idle_worker_process_makes_few_transactions(fault_dsn: str, build: str) -> None:
    before = _transactions(fault_dsn)
    worker = start_worker(
        fault_dsn, "idle", types="work", slots=10, poll=2.0, env={BROKEN_ENV: build}
    )
    try:
        cpu = _cpu_seconds(worker.proc.pid)
        time.sleep(IDLE_S)  # the point of the test: doing nothing for a while
        cpu = _cpu_seconds(worker.proc.pid) - cpu
    finally:
        worker.close()
    made = _transactions(fault_dsn) - before
    # Start and stop take about ten (schema check, register, first acquire, look-ahead,
    # the stop mark); idling: a poll every 2 s, a heartbeat, a reap.
    if build:
        # The spinning build fails the bound (by far on a quiet machine; on a loaded
        # one it spins slower, and still fails it).
        assert made >= IDLE_TRANSACTIONS, f"the control build made only {made} transactions"
        return
    assert made < IDLE_TRANSACTIONS, f"{made} transactions in {IDLE_S}s idle (with start and stop)"
    assert cpu < 0.05 * IDLE_S, f"{cpu:.2f}s CPU in {IDLE_S}s idle"
