"""The faults a load scenario injects, each recording what it disturbed.

Every injector counts the fault, the leases held at that moment (the bound on
duplicate executions it may cause) and how long until all those leases moved on.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import psycopg
from tests.faults._cluster import PrivateCluster
from tests.faults._fleet import WORKER_APP, Fleet
from tests.faults._load import Inject, Load
from tests.faults._oracle import Figures, RecoveryProbe, held_leases, writes_held
from tests.faults._proxy import Proxy

__all__ = [
    "hang_server",
    "kill_random_worker",
    "kill_worker_mid_group",
    "outage",
    "pause_busiest_worker",
    "recovery_bound",
    "restart_server",
    "stall_path",
    "terminate_backends",
]


def recovery_bound(load: Load) -> float:
    """Lease, plus the reaper's turns (one expired lease per turn, a turn at least
    every poll interval, spread over the surviving workers), plus 1 s of slack.

    A worker holds up to ``slots`` running jobs and, while handlers are short, as many
    again prefetched (the default ``prefetch``), waiting for a slot under leases of
    their own: a fault can leave all of them to expire and be reaped."""
    held = 2 * load.slots
    turns = held / max(1, load.workers - 1) + 1
    return load.lease + turns * load.poll + 1.0


Held = list[tuple[object, object]]


def _union(before: Held, after: Held) -> Held:
    """Leases held just before a fault and just after it: a job acquired while the
    fault was being injected was in flight too (the bound may count a job acquired
    right after the fault as well; it is an upper bound)."""
    return list(dict.fromkeys([*before, *after]))


def _probe(dsn: str, figures: Figures, held: Held, since: float, timeout: float) -> None:
    figures.faults += 1
    figures.in_flight_at_faults += len(held)
    figures.held_jobs.update(job for job, _ in held)
    recovery = RecoveryProbe(dsn, held, since).wait(timeout=timeout)
    figures.recovery_s.append(recovery if recovery is not None else float("inf"))


def kill_random_worker(
    dsn: str, load: Load, seed: int = 7, probe_timeout: float | None = None
) -> Inject:
    """SIGKILL one worker mid-job (the supervisor starts a replacement). The victim is
    frozen (SIGSTOP) for the moment it takes to read the leases it holds."""
    rng = random.Random(seed)
    timeout = probe_timeout if probe_timeout is not None else recovery_bound(load) + 3

    def inject(fleet: Fleet, figures: Figures) -> None:
        _kill(dsn, fleet, rng.randrange(len(fleet.workers)), figures, timeout)

    return inject


def _kill(dsn: str, fleet: Fleet, index: int, figures: Figures, timeout: float) -> None:
    """SIGKILL worker ``index``, frozen first (SIGSTOP) while the leases it holds are
    read, then probe how long until they all moved on."""
    victim = fleet.kill(index, signal.SIGSTOP)
    stopped_at = time.monotonic()
    # Read while the victim is frozen: it changes nothing, and its open transactions
    # stay open. Read only after the kill, a job whose lease had just expired could be
    # reaped in the moment between the kill and the read, and go uncounted.
    frozen = held_leases(dsn, worker=victim.worker_id)
    victim.send(signal.SIGKILL)
    victim.proc.wait(10)
    # And after the kill: a statement the victim sent before it froze (an acquire)
    # may have committed since; its fresh lease cannot have been reaped yet.
    held = _union(frozen, held_leases(dsn, worker=victim.worker_id))
    figures.notes.setdefault("victims", []).append(victim.worker_id)
    _probe(dsn, figures, held, stopped_at, timeout)


def pause_busiest_worker(
    dsn: str, load: Load, seconds: float, probe_timeout: float | None = None
) -> Inject:
    """SIGSTOP the worker holding the most leases for ``seconds``, less than a lease,
    then SIGCONT it: its leases hold throughout, so its jobs are still its own (and
    still count as running) when it resumes. The busiest, so that the pause does not
    fall on a replacement still starting up, holding nothing. Its leases are read
    while it is stopped, and again a moment later (a statement it sent just before
    may commit meanwhile)."""
    if seconds >= load.lease:
        raise ValueError(f"a pause of {seconds}s is not shorter than the {load.lease}s lease")
    timeout = probe_timeout if probe_timeout is not None else recovery_bound(load) + 3

    def inject(fleet: Fleet, figures: Figures) -> None:
        holding = _leases_by_worker(dsn)
        victim = max(fleet.each(), key=lambda w: holding[w.worker_id])
        victim.send(signal.SIGSTOP)
        at = time.monotonic()
        try:
            held = held_leases(dsn, worker=victim.worker_id)
            time.sleep(min(0.1, seconds))
            held = _union(held, held_leases(dsn, worker=victim.worker_id))
            time.sleep(max(0.0, at + seconds - time.monotonic()))
        finally:
            victim.send(signal.SIGCONT)
        figures.notes.setdefault("paused", []).append((victim.worker_id, len(held)))
        _probe(dsn, figures, held, at, timeout)

    return inject


def _leases_by_worker(dsn: str) -> Counter[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT leased_by, count(*) FROM pgwork.jobs WHERE status = 'running'"
            " GROUP BY leased_by"
        ).fetchall()
    return Counter({str(worker): int(n) for worker, n in rows})


# A job whose handler began this long ago and that is still running: with handlers of a
# few milliseconds, it has finished and waits for its group's commit.
_WAITING_MEMBER = """
SELECT j.leased_by FROM pgwork.jobs AS j
JOIN faults_ledger AS l
  ON l.job_id = j.id AND l.attempt = j.attempt AND l.worker = j.leased_by
WHERE j.status = 'running' AND l.at < clock_timestamp() - %s * interval '1 ms'
LIMIT 1
"""


def kill_worker_mid_group(
    dsn: str, load: Load, *, finished_ms: int = 15, probe_timeout: float | None = None
) -> Inject:
    """SIGKILL a worker at a moment one of its jobs began more than ``finished_ms`` ago
    (its ledger row) and is still running: for handlers shorter than that, a member
    waiting in an open group. A kill at a random moment can find none (CI once saw two
    kills in a row land where every job held was still to start), so this one waits
    for such a member, up to 2 s, and then kills a worker anyway. It reads nothing a
    build could change (the ledger and the jobs' leases), so a correct build and a
    broken one are killed alike."""
    timeout = probe_timeout if probe_timeout is not None else recovery_bound(load) + 3

    def inject(fleet: Fleet, figures: Figures) -> None:
        index, deadline = 0, time.monotonic() + 2.0
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(_WAITING_MEMBER, (finished_ms,)).fetchone()
                ids = [w.worker_id for w in fleet.workers]
                if row is not None and row[0] in ids:
                    index = ids.index(row[0])
                    figures.notes["kills_mid_group"] = figures.notes.get("kills_mid_group", 0) + 1
                    break
                time.sleep(0.002)
        _kill(dsn, fleet, index, figures, timeout)

    return inject


def terminate_backends(dsn: str, load: Load, *, probe_timeout: float | None = None) -> Inject:
    """pg_terminate_backend on every connection of every worker process."""
    timeout = probe_timeout if probe_timeout is not None else recovery_bound(load) + 5

    def inject(fleet: Fleet, figures: Figures) -> None:
        held = held_leases(dsn)
        at = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (WORKER_APP,),
            ).fetchone()
        figures.notes["backends_terminated"] = figures.notes.get("backends_terminated", 0) + (
            row[0] if row else 0
        )
        _probe(dsn, figures, _union(held, held_leases(dsn)), at, timeout)

    return inject


Mode = Literal["fast", "immediate"]


def restart_server(
    dsn: str, load: Load, cluster: PrivateCluster, mode: Mode, *, probe_timeout: float | None = None
) -> Inject:
    """``pg_ctl restart -m mode`` the private cluster under load."""
    timeout = probe_timeout if probe_timeout is not None else recovery_bound(load) + 10

    def inject(fleet: Fleet, figures: Figures) -> None:
        held = held_leases(dsn)
        at = time.monotonic()
        cluster.restart(mode)
        figures.notes.setdefault("restart_s", []).append(round(time.monotonic() - at, 3))
        _probe(dsn, figures, _union(held, held_leases(dsn)), at, timeout)

    return inject


def _cpu_seconds(pid: int) -> float:
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(times.user + times.system)


def outage(
    dsn: str, load: Load, cluster: PrivateCluster, seconds: float, *, probe_timeout: float = 30
) -> Inject:
    """Stop the server for ``seconds`` (longer than the lease), then start it again.

    Records, per outage, the busiest worker's CPU use while the server was down and its
    number of failed turns and listener reconnect attempts (a busy loop shows in both).
    Recovery is counted from the moment the server is back."""

    def inject(fleet: Fleet, figures: Figures) -> None:
        held = held_leases(dsn)
        workers = fleet.each()
        cluster.stop("fast")
        cpu = {w.worker_id: _cpu_seconds(w.pid) for w in workers}
        seen = {w.worker_id: len(w.lines) for w in workers}
        time.sleep(seconds)
        busiest = max((_cpu_seconds(w.pid) - cpu[w.worker_id]) / seconds for w in workers)
        retries = max(
            sum(
                1
                for line in w.lines[seen[w.worker_id] :]
                if "turn failed" in line.text or "reconnect failed" in line.text
            )
            for w in workers
        )
        cluster.start()
        back_at = time.monotonic()
        notes = figures.notes
        notes.setdefault("outage_s", []).append(seconds)
        notes.setdefault("worker_cpu_while_down", []).append(round(busiest, 3))
        notes.setdefault("retries_while_down", []).append(retries)
        held = _union(held, held_leases(dsn))
        _probe(dsn, figures, held, back_at, recovery_bound(load) + probe_timeout)

    return inject


def hang_server(
    dsn: str,
    load: Load,
    cluster: PrivateCluster,
    seconds: float,
    *,
    thawed: list[float] | None = None,
    probe_timeout: float | None = None,
) -> Inject:
    """SIGSTOP every process of the cluster for ``seconds`` (longer than the lease),
    then SIGCONT: a database that hangs, sockets open, nothing refused or reset.

    Nothing changes in the database while it is frozen, so the leases read just before
    the freeze are those the hang found held: the read keeps every write to the jobs
    table waiting until the thaw (``writes_held``), so no acquire commits between the
    read and the freeze. A handler that began before the freeze may record its start
    only after the thaw (its ledger write hung with the server), on a lease that lapsed
    meanwhile. Recovery is counted from the thaw; ``thawed`` collects the moments
    (monotonic) of the thaws."""
    timeout = probe_timeout if probe_timeout is not None else recovery_bound(load) + 10

    def inject(fleet: Fleet, figures: Figures) -> None:
        with writes_held(dsn) as held:
            pids = cluster.freeze()
            try:
                time.sleep(seconds)
            finally:
                cluster.thaw(pids)
        back_at = time.monotonic()
        if thawed is not None:
            thawed.append(back_at)
        figures.notes.setdefault("hang_s", []).append(seconds)
        figures.notes["processes_frozen"] = len(pids)
        _probe(dsn, figures, _union(held, held_leases(dsn)), back_at, timeout)

    return inject


def stall_path(
    dsn: str,
    load: Load,
    proxies: Sequence[Proxy],
    seconds: float,
    seed: int = 11,
    *,
    resumed: list[tuple[str, float]] | None = None,
    probe_timeout: float | None = None,
) -> Inject:
    """Stall one worker's network path (its proxy: state, notify and ledger
    connections) for ``seconds``, longer than the lease, then resume it.

    The worker lives on, its sockets open; the others reap its expired leases. Its
    leases are read before the stall and again once a statement it sent just before
    could have committed (0.2 s, well inside any lease it holds): it can change nothing
    in between. Recovery is counted from the stall: its atomic jobs stay locked by its
    open transactions until the path resumes. ``resumed`` collects (worker id,
    monotonic moment) of each resume."""
    rng = random.Random(seed)
    timeout = probe_timeout if probe_timeout is not None else seconds + recovery_bound(load) + 5

    def inject(fleet: Fleet, figures: Figures) -> None:
        index = rng.randrange(len(proxies))
        victim = fleet.each()[index]
        before = held_leases(dsn, worker=victim.worker_id)
        proxies[index].stall()
        stalled_at = time.monotonic()
        try:
            time.sleep(0.2)
            held = _union(before, held_leases(dsn, worker=victim.worker_id))
            time.sleep(max(0.0, stalled_at + seconds - time.monotonic()))
        finally:
            proxies[index].resume()
        if resumed is not None:
            resumed.append((victim.worker_id, time.monotonic()))
        figures.notes.setdefault("victims", []).append(victim.worker_id)
        _probe(dsn, figures, held, stalled_at, timeout)

    return inject
