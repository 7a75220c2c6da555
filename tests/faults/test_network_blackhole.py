"""A network path that silently drops the connections it carries (a NAT or load
balancer that lost their state): no error, no reset, the sockets stay open and nothing
comes back, while new connections work. A worker must notice and carry on over new
connections: a job enqueued afterwards must still run.

Two mechanisms, each with a control build that lacks it:

- the state adapter bounds each operation on its own connections
  (``operation_timeout``): the silent connection is closed and a new one used;
- the listener probes itself after a quiet spell (``check_interval``) and reconnects
  when its probe does not come back, so wake-ups by notification resume.

An atomic attempt in flight is bounded the same way, to its completion and COMMIT: the
worker stops when told to, and the job runs again elsewhere.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from tests.faults._cluster import PrivateCluster
from tests.faults._db import fetch
from tests.faults._fleet import WorkerProcess, start_worker
from tests.faults._jobs import Spec
from tests.faults._load import enqueue
from tests.faults._oracle import wait_settled
from tests.faults._proxy import Proxy, via

from pgwork.worker._loop import LATE_SETTLE_S

pytestmark = pytest.mark.timeout(90)

LEASE = 1.0
POLL = 0.2
OPERATION_TIMEOUT = "2"
# The operation bound, the pool's replacement connection and a backoff, twice over.
WITHIN = 10.0


def _second_job_after_blackhole(
    fault_dsn: str, cluster: PrivateCluster, **options: object
) -> tuple[bool, float, list[str]]:
    """A worker through a proxy runs a first job (its pool and listener now hold
    connections); then the proxy black-holes them all and a second job is enqueued
    directly: whether it settled within WITHIN, how long that took, and the worker's
    last lines."""
    proxy = Proxy(cluster.port).start()
    # The handlers' ledger goes direct: the test's own bookkeeping is not on trial.
    worker = start_worker(
        via(fault_dsn, proxy.port),
        "blackholed",
        types="work",
        slots=2,
        lease=LEASE,
        ledger_dsn=fault_dsn,
        **options,
    )
    try:
        enqueue(fault_dsn, [("work", Spec(n=0, ms=10))])
        assert wait_settled(fault_dsn, WITHIN)
        proxy.blackhole()
        started = time.monotonic()
        enqueue(fault_dsn, [("work", Spec(n=1, ms=10))])
        settled = wait_settled(fault_dsn, WITHIN)
        took = time.monotonic() - started
        return settled, took, [line.text for line in worker.lines[-10:]]
    finally:
        worker.close()
        proxy.close()


@pytest.mark.parametrize(
    ("build", "operation_timeout"), [("bounded", OPERATION_TIMEOUT), ("control-unbounded", "none")]
)
def test_worker_whose_connections_blackhole_still_runs_new_jobs(
    fault_dsn: str, cluster: PrivateCluster, build: str, operation_timeout: str
) -> None:
    settled, took, tail = _second_job_after_blackhole(
        fault_dsn, cluster, poll=POLL, operation_timeout=operation_timeout
    )
    left = fetch(fault_dsn, "SELECT status::text FROM pgwork.jobs WHERE status <> 'completed'")
    if build == "bounded":
        assert settled, (left, tail)
        assert any("no answer" in line for line in tail), tail
    else:
        # Without the bound the worker waits on its silent pool connections for ever.
        assert not settled, (took, tail)


@pytest.mark.parametrize(
    ("build", "listener_check"), [("checked", "1"), ("control-unchecked", "none")]
)
def test_listener_whose_connection_blackholes_is_replaced(
    fault_dsn: str, cluster: PrivateCluster, build: str, listener_check: str
) -> None:
    """With a 30 s poll the second job can only be found through a notification, so
    only a listener that noticed its connection went silent picks it up in time."""
    settled, took, tail = _second_job_after_blackhole(
        fault_dsn,
        cluster,
        poll=30.0,
        operation_timeout=OPERATION_TIMEOUT,
        listener_check=listener_check,
    )
    if build == "checked":
        assert settled, tail
        assert any("reconnecting" in line for line in tail), tail
    else:
        assert not settled, (took, tail)


# An atomic attempt in flight when the black-hole starts: its handler sleeps this long
# after writing its effect (through the proxy), inside its transaction.
ATOMIC_MS = 1000
ATOMIC_GRACE = 2.0
# The worker's abandon_after (the library's default): stop() returns within
# grace_period + abandon_after and a moment for its last writes (LATE_SETTLE_S,
# docs/workers.md), and the process exits right after.
ABANDON_AFTER = 5.0
# The process's exit after stop() returned (the interpreter's teardown, and the late
# reports of the batcher's last write, which stop() gives up to LATE_SETTLE_S more):
# under the CI's three suites side by side on two cores this took over two seconds.
# The control (a stop() that waits for every slot task) waits out the completion's
# 30 s bound, far past this.
EXIT_S = 4.0


def _effect_in_transaction(dsn: str) -> bool:
    """Whether an atomic handler's effect row is written and its transaction open."""
    rows = fetch(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
        "AND query LIKE 'INSERT INTO faults_effects%%'",
    )
    return rows[0][0] > 0


def _atomic_in_flight(
    fault_dsn: str, proxy: Proxy, atomic_group: int, operation_timeout: str | None
) -> WorkerProcess:
    """A worker through ``proxy`` whose one atomic job's handler has written its
    effect, its transaction open, when the proxy black-holes every connection."""
    worker = start_worker(
        via(fault_dsn, proxy.port),
        "blackholed",
        types="effect",
        slots=2,
        lease=LEASE,
        poll=POLL,
        grace=ATOMIC_GRACE,
        atomic_group=atomic_group,
        atomic_group_wait=0.05,
        ledger_dsn=fault_dsn,
        operation_timeout=operation_timeout,
    )
    try:
        [job] = enqueue(fault_dsn, [("effect", Spec(n=0, ms=ATOMIC_MS))])
        worker.wait_for(rf"^started {job} 1$")
        deadline = time.monotonic() + WITHIN
        while not _effect_in_transaction(fault_dsn):
            assert time.monotonic() < deadline, worker.lines[-10:]
            time.sleep(0.02)
        proxy.blackhole()
    except BaseException:
        worker.close()
        raise
    return worker


def _one_effect_committed(fault_dsn: str) -> None:
    assert fetch(fault_dsn, "SELECT status::text FROM pgwork.jobs") == [("completed",)]
    assert fetch(fault_dsn, "SELECT count(*) FROM faults_effects") == [(1,)]


@pytest.mark.parametrize("atomic_group", [1, 4])
@pytest.mark.parametrize(
    ("build", "operation_timeout"), [("bounded", OPERATION_TIMEOUT), ("control-unbounded", "none")]
)
def test_atomic_attempt_whose_connections_blackhole_is_settled_by_its_worker(
    fault_dsn: str, cluster: PrivateCluster, build: str, operation_timeout: str, atomic_group: int
) -> None:
    """An atomic job's handler has written its effect when the worker's connections go
    silent. Every statement of the attempt, its completion and COMMIT included, gives
    up once ``operation_timeout`` passes: the transaction is lost (the server rolls it
    back once its idle bound ends it), the attempt settles as failed, and the worker
    runs the job again over new connections, its effect once. (Control: without the
    bound no statement of the attempt ever gives up; the job is recovered, if at all,
    only once the watchdog abandons the handler and a reaper takes the lapsed lease.)"""
    proxy = Proxy(cluster.port).start()
    worker = _atomic_in_flight(fault_dsn, proxy, atomic_group, operation_timeout)
    try:
        settled = wait_settled(fault_dsn, 30)
        lines = [line.text for line in worker.lines]
    finally:
        worker.close()
        proxy.close()
    gave_up = [line for line in lines if "no answer" in line]
    if build == "control-unbounded":
        # No statement of the attempt gives up (the notify adapter's announcements
        # have a bound of their own, whatever operation_timeout is).
        assert not [line for line in gave_up if "announce" not in line], lines[-15:]
        return
    assert settled, lines[-15:]
    assert gave_up, lines[-15:]
    _one_effect_committed(fault_dsn)


@pytest.mark.parametrize("atomic_group", [1, 4])
@pytest.mark.parametrize(
    ("build", "operation_timeout"),
    [("bounded", OPERATION_TIMEOUT), ("library-default", None)],
)
def test_worker_stops_in_time_with_an_atomic_attempt_whose_connections_blackhole(
    fault_dsn: str,
    cluster: PrivateCluster,
    build: str,
    operation_timeout: str | None,
    atomic_group: int,
) -> None:
    """The same, and SIGTERM follows the black-hole: the worker stops within its
    bound, whatever ``operation_timeout`` is (the library's, 30 s, is longer than
    that: stop() leaves behind what it cannot settle in time); the effect never
    committed, and the job runs again on another worker, its effect once. (Control:
    stop() waiting for every slot task, as it did: the library-default build waits
    out the completion's bound.)"""
    proxy = Proxy(cluster.port).start()
    worker = _atomic_in_flight(fault_dsn, proxy, atomic_group, operation_timeout)
    successor = None
    try:
        signalled = time.monotonic()
        worker.send(signal.SIGTERM)
        bound = ATOMIC_GRACE + ABANDON_AFTER + LATE_SETTLE_S + EXIT_S
        try:
            worker.proc.wait(bound)
            stopped_s: float | None = time.monotonic() - signalled
        except subprocess.TimeoutExpired:
            stopped_s = None
        tail = [line.text for line in worker.lines[-15:]]
        assert stopped_s is not None, tail
        successor = start_worker(fault_dsn, "successor", types="effect", slots=2, lease=LEASE)
        assert wait_settled(fault_dsn, 30), tail
    finally:
        if successor is not None:
            successor.close()
        worker.close()
        proxy.close()
    _one_effect_committed(fault_dsn)
