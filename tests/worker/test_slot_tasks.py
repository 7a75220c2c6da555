"""``SlotTasks``: the worker owns its slot tasks until their coroutines report their
end (``ended``, from their ``finally``), with no done callback per task."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pgwork.worker._slots import SlotTasks

pytestmark = pytest.mark.anyio


class Fatal(BaseException):
    """Not an ``Exception``: the slot coroutine does not catch it."""


def _slot_coroutine(tasks: SlotTasks, gate: asyncio.Event, *, raises: BaseException | None = None):  # type: ignore[no-untyped-def]
    async def body() -> None:
        error: BaseException | None = None
        try:
            await gate.wait()
            if raises is not None:
                raise raises
        except BaseException as exc:
            error = exc
            raise
        finally:
            tasks.ended(error)

    return body()


async def test_a_task_is_owned_until_its_coroutine_ends() -> None:
    tasks = SlotTasks()
    gate = asyncio.Event()
    task = tasks.start(_slot_coroutine(tasks, gate), name="slot")
    await asyncio.sleep(0)
    assert len(tasks) == 1
    gate.set()
    await asyncio.wait_for(tasks.wait(), timeout=10)
    assert len(tasks) == 0
    assert task.done()


async def test_a_task_cancelled_before_its_first_step_does_not_stay_owned() -> None:
    """Its coroutine never runs, nor its ``finally``: the cancellation itself must let
    it go, or the worker would wait out the limit and report it as a stuck handler."""
    tasks = SlotTasks()
    task = tasks.start(_slot_coroutine(tasks, asyncio.Event()), name="slot")
    stuck = await tasks.cancel_and_wait(1.0)  # before the event loop ran it at all
    assert stuck == []
    assert task.cancelled()
    assert len(tasks) == 0


async def test_a_started_task_cancelled_with_the_worker_is_let_go() -> None:
    tasks = SlotTasks()
    task = tasks.start(_slot_coroutine(tasks, asyncio.Event()), name="slot")
    await asyncio.sleep(0)  # now waiting inside its coroutine
    assert await tasks.cancel_and_wait(5.0) == []
    assert task.cancelled()


async def test_a_base_exception_is_logged_unless_the_task_was_detached(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = SlotTasks()
    gates = asyncio.Event(), asyncio.Event()
    owned = tasks.start(_slot_coroutine(tasks, gates[0], raises=Fatal(3)), name="owned")
    detached = tasks.start(_slot_coroutine(tasks, gates[1], raises=Fatal(4)), name="detached")
    await asyncio.sleep(0)
    tasks.detach(detached)
    with caplog.at_level(logging.ERROR, logger="pgwork.worker"):
        for gate in gates:
            gate.set()
        await asyncio.wait([owned, detached], timeout=10)
    assert [r.getMessage() for r in caplog.records] == [
        "pgwork slot task owned ended with Fatal(3)"
    ]
    assert len(tasks) == 0
    for task in (owned, detached):
        assert isinstance(task.exception(), Fatal)


def test_slot_tasks_follow_a_worker_onto_another_event_loop() -> None:
    """The event loop is looked up once while tasks run, not per task; once none runs
    it is looked up again, so the same ``SlotTasks`` serves a worker run on a second
    loop (a process that ``asyncio.run``s twice)."""
    tasks = SlotTasks()

    async def one_run() -> asyncio.AbstractEventLoop:
        gate = asyncio.Event()
        task = tasks.start(_slot_coroutine(tasks, gate), name="slot")
        gate.set()
        await asyncio.wait_for(tasks.wait(), timeout=10)
        assert task.done()
        assert task.exception() is None
        assert len(tasks) == 0
        return task.get_loop()

    first = asyncio.run(one_run())
    second = asyncio.run(one_run())
    assert first is not second
