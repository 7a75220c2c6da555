"""Worker processes for the fault scenarios, and a supervisor that restarts them.

Each process runs ``tests.faults._worker``; a reader thread collects its output lines
(with the monotonic time they arrived) so a test can wait for an event such as
``started <job>`` or ``event listener.reconnected``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BROKEN_ENV",
    "WORKER_APP",
    "Fleet",
    "Line",
    "WorkerProcess",
    "broken_builds_started",
    "forget_started_builds",
    "worker_dsn",
]

REPO = Path(__file__).resolve().parents[2]
# Every connection a worker process opens carries this name, so a scenario can find
# (and terminate) exactly the workers' backends and nothing of its own.
WORKER_APP = "pgwork-fault-worker"
# Names the deliberately broken build a worker process runs (tests.faults._worker
# swaps the adapter's SQL accordingly); unset or empty: the library as shipped.
BROKEN_ENV = "PGWORK_FAULTS_BROKEN"

# The broken builds of the worker processes started since forget_started_builds(): the
# end-of-run table marks a scenario that ran one as a control.
_broken_started: set[str] = set()


def broken_builds_started() -> list[str]:
    return sorted(_broken_started)


def forget_started_builds() -> None:
    _broken_started.clear()


def worker_dsn(dsn: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={WORKER_APP}"


@dataclass(frozen=True, slots=True)
class Line:
    at: float
    text: str


@dataclass(frozen=True, slots=True)
class Options:
    types: str = "work,effect,quiet"
    slots: int = 8
    lease: float = 2.0
    poll: float = 0.5
    grace: float = 0.2
    atomic_group: int = 1
    atomic_group_wait: float = 0.005
    # The library's default max_slots and pool size instead of ``slots`` (and room).
    defaults: bool = False
    # Where handlers write the ledger (default: the worker's own DSN).
    ledger_dsn: str | None = None
    # The state adapter's operation_timeout and the listener's check_interval in
    # seconds, "none" for no bound; unset: the library's defaults.
    operation_timeout: str | None = None
    listener_check: str | None = None
    # The worker's heartbeat_interval and dead_worker_after in seconds (unset: the
    # library's defaults).
    heartbeat: float | None = None
    dead_after: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)


class WorkerProcess:
    """One ``python -m tests.faults._worker`` process and everything it printed."""

    def __init__(self, dsn: str, worker_id: str, options: Options) -> None:
        self.worker_id = worker_id
        self.lines: list[Line] = []
        self.expected_exit = False
        self._changed = threading.Condition()
        if broken := options.env.get(BROKEN_ENV):
            _broken_started.add(broken)
        args = [
            sys.executable, "-m", "tests.faults._worker", worker_dsn(dsn),
            "--worker-id", worker_id, "--types", options.types,
            "--slots", str(options.slots), "--lease", str(options.lease),
            "--poll", str(options.poll), "--grace", str(options.grace),
            "--atomic-group", str(options.atomic_group),
            "--atomic-group-wait", str(options.atomic_group_wait),
            *(["--defaults"] if options.defaults else []),
            *(["--operation-timeout", options.operation_timeout]
              if options.operation_timeout else []),
            *(["--listener-check", options.listener_check] if options.listener_check else []),
            *(["--heartbeat", str(options.heartbeat)] if options.heartbeat else []),
            *(["--dead-after", str(options.dead_after)] if options.dead_after else []),
            *(["--ledger-dsn", worker_dsn(options.ledger_dsn)] if options.ledger_dsn else []),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={**os.environ, **options.env},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._changed:
                self.lines.append(Line(time.monotonic(), raw.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for(self, pattern: str, *, timeout: float = 20.0, since: int = 0) -> tuple[int, Line]:
        """Wait for a line (from index ``since``) matching regex ``pattern``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for index in range(since, len(self.lines)):
                    if regex.search(self.lines[index].text):
                        return index, self.lines[index]
                since = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (not self.alive and not self._reader.is_alive()):
                    raise AssertionError(
                        f"{self.worker_id}: no line matching {pattern!r} within {timeout}s; "
                        f"last lines:\n" + "\n".join(line.text for line in self.lines[-30:])
                    )
                self._changed.wait(min(left, 0.2))

    def wait_ready(self, timeout: float = 30.0) -> None:
        self.wait_for(r"^event worker\.started ", timeout=timeout)

    def matching(self, pattern: str) -> list[Line]:
        regex = re.compile(pattern)
        with self._changed:
            return [line for line in self.lines if regex.search(line.text)]

    def send(self, sig: signal.Signals) -> None:
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.expected_exit = True
        self.proc.send_signal(sig)

    def close(self, timeout: float = 10.0) -> None:
        """SIGCONT + SIGTERM, then SIGKILL if it does not stop in time."""
        if self.alive:
            self.expected_exit = True
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._reader.join(timeout)


@dataclass(slots=True)
class Exit:
    worker_id: str
    returncode: int
    expected: bool
    tail: list[str]


class Fleet:
    """``size`` worker processes; with ``supervise`` a dead one is replaced (new id)."""

    def __init__(
        self,
        dsn: str,
        size: int,
        options: Options,
        *,
        supervise: bool = True,
        prefix: str = "w",
        route: Callable[[int], str] | None = None,
    ) -> None:
        self.dsn = dsn
        # Worker ``index``'s DSN (its replacements' too): e.g. through a proxy of its own.
        self.route = route or (lambda index: dsn)
        self.options = options
        self.supervise = supervise
        self.prefix = prefix
        self.workers: list[WorkerProcess] = []
        self.retired: list[WorkerProcess] = []
        self.exits: list[Exit] = []
        self.restarts = 0
        self._generation = [0] * size
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        for index in range(size):
            self.workers.append(self._spawn(index))

    def _spawn(self, index: int) -> WorkerProcess:
        worker_id = f"{self.prefix}{index}.{self._generation[index]}"
        self._generation[index] += 1
        return WorkerProcess(self.route(index), worker_id, self.options)

    def start(self, timeout: float = 30.0) -> Fleet:
        for worker in self.workers:
            worker.wait_ready(timeout)
        self._supervisor.start()
        return self

    def _supervise(self) -> None:
        while not self._closing.wait(0.05):
            with self._lock:
                for index, worker in enumerate(self.workers):
                    if worker.alive:
                        continue
                    worker.close()
                    self.exits.append(
                        Exit(
                            worker.worker_id,
                            worker.proc.returncode,
                            worker.expected_exit,
                            [line.text for line in worker.lines[-40:]],
                        )
                    )
                    self.retired.append(worker)
                    if self.supervise and not self._closing.is_set():
                        self.workers[index] = self._spawn(index)
                        self.restarts += 1

    def unexpected_exits(self) -> list[Exit]:
        with self._lock:
            return [e for e in self.exits if not e.expected]

    def kill(self, index: int, sig: signal.Signals = signal.SIGKILL) -> WorkerProcess:
        with self._lock:
            victim = self.workers[index]
            victim.send(sig)
        return victim

    def each(self) -> list[WorkerProcess]:
        with self._lock:
            return list(self.workers)

    def all_lines(self, pattern: str) -> list[Line]:
        with self._lock:
            everyone = self.retired + self.workers
        return [line for worker in everyone for line in worker.matching(pattern)]

    def said_between(self, start: float, end: float, pattern: str) -> list[tuple[str, Line]]:
        """(worker id, line) of every worker's lines matching ``pattern`` said between
        monotonic ``start`` and ``end``, in time order."""
        with self._lock:
            everyone = self.retired + self.workers
        said = [
            (w.worker_id, line)
            for w in everyone
            for line in w.matching(pattern)
            if start <= line.at <= end
        ]
        return sorted(said, key=lambda pair: pair[1].at)

    def started_since(self, at: float) -> dict[str, int]:
        """Handlers each worker (retired ones included) started after monotonic ``at``."""
        with self._lock:
            everyone = self.retired + self.workers
        return {
            w.worker_id: sum(1 for line in w.matching(r"^started ") if line.at > at)
            for w in everyone
        }

    def wait_all_ready(self, timeout: float = 30.0) -> None:
        for worker in self.each():
            worker.wait_ready(timeout)

    def close(self) -> None:
        self._closing.set()
        if self._supervisor.is_alive():
            self._supervisor.join(5)
        with self._lock:
            for worker in self.workers:
                worker.close()

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start_worker(dsn: str, worker_id: str, **options: object) -> WorkerProcess:
    """One worker process, returned once it is running (listening and polling)."""
    worker = WorkerProcess(dsn, worker_id, Options(**options))  # type: ignore[arg-type]
    try:
        worker.wait_ready()
    except BaseException:
        worker.close()
        raise
    return worker
