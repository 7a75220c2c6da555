"""What the conformance tests of the Django backend share: a worker of the backend run
in-process, waiting for a result to finish, and catching the signals Django sends."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from anyio.from_thread import start_blocking_portal

from pgwork.contrib.django._compat import TaskResult
from pgwork.contrib.django._worker import build_worker
from pgwork.worker import InProcessWorker

__all__ = ["received", "running_worker", "wait_finished", "wait_until"]


@contextmanager
def running_worker(alias: str = "default", **options: Any) -> Iterator[InProcessWorker]:
    """The worker ``manage.py pgwork_worker`` runs (``build_worker``), on an event loop
    of its own in a thread of its own, so that the test's thread stays a plain Django
    thread (the ORM refuses a thread whose event loop runs). Stopped at the end."""
    with start_blocking_portal(backend="asyncio") as portal:
        worker = portal.call(partial(build_worker, alias, poll_interval=0.1, **options))
        try:
            portal.call(worker.start)
            yield worker
        finally:
            portal.call(worker.stop)
            portal.call(worker.client.close)


def wait_until(
    result: TaskResult, reached: Callable[[TaskResult], bool], timeout: float = 30.0
) -> None:
    """Refresh ``result`` until ``reached(result)``."""
    deadline = time.monotonic() + timeout
    while not reached(result):
        assert time.monotonic() < deadline, f"{result.task.name} still {result.status}"
        time.sleep(0.05)
        result.refresh()


def wait_finished(result: TaskResult, timeout: float = 30.0) -> None:
    """Refresh ``result`` until it is finished."""
    wait_until(result, lambda r: r.is_finished, timeout)


@contextmanager
def received(signal: Any) -> Iterator[list[tuple[Any, TaskResult]]]:
    """The (sender, task_result) of each time ``signal`` is sent within the block, from
    any thread."""
    seen: list[tuple[Any, TaskResult]] = []

    def receiver(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        seen.append((sender, task_result))

    uid = f"received-{id(seen)}"
    signal.connect(receiver, weak=False, dispatch_uid=uid)
    try:
        yield seen
    finally:
        signal.disconnect(dispatch_uid=uid)
