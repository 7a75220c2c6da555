"""A step that sleeps (``Continue(..., after=...)``) costs nothing while it waits and
starts on time, by the worker's timer rather than its poll.

The worker learns the step's due time from the hand-on (a ``ready`` notice carrying
it, and ``next_due``'s look-ahead) and keeps a timer for it: an idle worker with a
step due in two days makes no acquire in the meantime. The start on time under a
30 s poll, with its control deaf to due times, is
``test_wakeups.test_a_delayed_continuation_starts_when_due_not_at_the_next_poll``; the
test here adds the step seen as waiting (``client.waiting``) until the timer starts it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import anyio
import pytest

from pgwork import Attempt, Continue, JobTypeRegistry, WaitKind
from pgwork.observability import ADAPTER_CALL_STOP, Event, InstrumentedStateAdapter
from pgwork.worker._wakeups import Wakeups

from ._wakeup_kit import PROMPT, Num, Starts, enqueue, no_due
from .conftest import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

ACQUIRES = {"acquire", "acquire_limited", "complete_and_acquire"}
IDLE_S = 3.0


class Acquires:
    """Counts the acquire statements a worker's state adapter ran."""

    def __init__(self) -> None:
        self.count = 0

    def on_event(self, event: Event) -> None:
        if event.name == ADAPTER_CALL_STOP and event["operation"] in ACQUIRES:
            self.count += 1


def _sleeper(after: timedelta) -> tuple[JobTypeRegistry, Any, Any, Starts]:
    reg = JobTypeRegistry()
    later = reg.job_type("later", input=Num, entry=False)
    first = reg.job_type("first", input=Num, continue_with=[later])

    async def hand_on(attempt: Attempt[Num, Any]) -> Any:
        return Continue(later, Num(n=2), after=after)

    return reg, first, {first: hand_on, later: (starts := Starts())}, starts


@pytest.mark.parametrize("build", ["timer", "control-polls-the-sleeping-step"])
async def test_a_step_sleeping_for_days_costs_no_acquire_while_it_waits(
    pgwork_dsn: str,
    make_client: Any,
    start_worker: Any,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if build == "control-polls-the-sleeping-step":
        # The mechanism removed: the worker does not wait for the due time it learnt,
        # but looks again every 50 ms (each look finds nothing and asks the database
        # when the next job is due), as a worker polling its sleeping steps would.
        due_in = Wakeups.due_in
        monkeypatch.setattr(
            Wakeups, "due_in", lambda self, seconds: due_in(self, min(seconds, 0.05))
        )
    reg, first, processors, starts = _sleeper(timedelta(days=2))
    acquires = Acquires()
    client = await make_client(
        reg, store=lambda state: InstrumentedStateAdapter(state, observers=[acquires])
    )
    worker = await start_worker(client=client, processors=processors)
    chain = await enqueue(pgwork_dsn, client, first)

    async def sleeping() -> bool:
        found = await client.waiting(chain.id)
        return found is not None and found.kind is WaitKind.SLEEP

    await eventually(sleeping, timeout=PROMPT, what="the step sleeping")

    async def settled() -> bool:
        return not worker._wakeups.may_have_work

    await eventually(settled, timeout=PROMPT, what="the worker idle again")
    before = acquires.count
    await anyio.sleep(IDLE_S)
    during = acquires.count - before

    if build == "control-polls-the-sleeping-step":
        assert during > 20, f"the control made only {during} acquires in {IDLE_S}s"
        return
    # No poll (30 s) and no timer (two days) falls in the window.
    assert during == 0, f"{during} acquires while the step slept"
    assert starts.times == []


@pytest.mark.parametrize("build", ["timer", "control-deaf-to-due-times"])
async def test_a_step_due_soon_shows_as_sleeping_then_starts_by_the_timer(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    reg, first, processors, starts = _sleeper(timedelta(seconds=1.5))
    client = await clients(reg, drop=None if build == "timer" else no_due)
    await start_worker(client=client, processors=processors)
    chain = await enqueue(pgwork_dsn, client, first)
    handed_on = time.monotonic()

    async def sleeping() -> bool:
        found = await client.waiting(chain.id)
        return found is not None and found.kind is WaitKind.SLEEP

    await eventually(sleeping, timeout=PROMPT, what="the step sleeping")
    started = await starts.within(1.5 + PROMPT)
    assert started is (build == "timer")
    if started:
        assert starts.times[0] - handed_on >= 1.4
        assert await client.waiting(chain.id) is None
