"""A progress line while a test runs long: pytest prints a test's result only once it
ends, and some tests here run for a minute or more (fault scenarios, demos, servers),
so a run could sit silent for minutes. A pytest plugin (the root conftest.py loads it).

The line is written while a test runs, when pytest's output capture holds the
process's standard output (file descriptor 1 points at a capture file): written there,
it would be shown only with a failing test's captured output. So it goes to a
duplicate of the descriptor taken at configuration, when capture is suspended: the
terminal, or whatever the run's output was sent to.

Every ``--progress-every`` seconds (default 30; 0: never) during which no test has
ended, a line says how far the run is and which test is running, for how long::

    [progress] 412/1378 tests done, 6 min 32 s in; running tests/x.py::test_y (75 s)
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

import pytest

__all__ = ["BEAT", "Progress"]

# Set at every progress line: lets a test of this plugin wait for one, not for a time.
BEAT = threading.Event()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--progress-every",
        type=float,
        default=30.0,
        help="print a progress line after this many seconds without a test ending "
        "(default 30; 0 turns it off)",
    )


class Progress:
    """The run's position (tests done out of collected, the running test and since
    when), written by pytest's hooks and read by the ticker thread."""

    def __init__(
        self, reporter: pytest.TerminalReporter, every: float, out: TextIO | None = None
    ) -> None:
        self.reporter = reporter
        self.every = every
        self.out = out  # past the output capture; None: through the reporter
        self._at_line_start = False  # a progress line ended the reporter's line
        self.started = time.monotonic()
        self.total = 0
        self.done = 0
        self.running: tuple[str, float] | None = None
        self.last_news = self.started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.out is not None:
            self.out.close()

    def test_started(self, nodeid: str) -> None:
        with self._lock:
            self.running = (nodeid, time.monotonic())

    def test_ended(self) -> None:
        with self._lock:
            self.done += 1
            self.running = None
            self._at_line_start = False
            self.last_news = time.monotonic()

    def line(self, now: float) -> str | None:
        """The progress line due at ``now``, or None when a test ended recently."""
        with self._lock:
            if now - self.last_news < self.every or self.running is None:
                return None
            self.last_news = now
            nodeid, since = self.running
            done, total = self.done, self.total
        return (
            f"[progress] {done}/{total} tests done, {_duration(now - self.started)} in; "
            f"running {nodeid} ({now - since:.0f} s)"
        )

    def _tick(self) -> None:
        while not self._stop.wait(min(self.every, 1.0)):
            text = self.line(time.monotonic())
            if text is not None:
                self.write(text)
                BEAT.set()

    def write(self, text: str) -> None:
        if self.out is None:
            self.reporter.write_line(text)
            return
        # On a line of its own: the reporter may be halfway through a file's results.
        with self._lock:
            start = "" if self._at_line_start or not self.reporter.currentfspath else "\n"
            self._at_line_start = True
        self.out.write(f"{start}{text}\n")
        self.out.flush()


def _uncaptured_stdout() -> TextIO | None:
    """A stream on a duplicate of standard output's descriptor as it is now (outside
    any test), or None where standard output has no descriptor (pytest run in process
    by pytester, whose capture is of ``sys.stdout`` alone)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    return open(os.dup(fd), "w", encoding="utf-8", errors="replace", closefd=True)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


_PROGRESS = pytest.StashKey[Progress]()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    every = config.getoption("--progress-every")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if every and every > 0 and reporter is not None:
        config.stash[_PROGRESS] = Progress(reporter, every, _uncaptured_stdout())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if (progress := config.stash.get(_PROGRESS, None)) is not None:
        progress.total = len(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[None]:
    progress = session.config.stash.get(_PROGRESS, None)
    if progress is None:
        return (yield)
    progress.start()
    try:
        return (yield)
    finally:
        progress.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    progress = item.config.stash.get(_PROGRESS, None)
    if progress is not None:
        progress.test_started(item.nodeid)
    try:
        return (yield)
    finally:
        if progress is not None:
            progress.test_ended()
