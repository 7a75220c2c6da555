"""A slot's life: the table of its states (``_slot.TRANSITIONS``), what each move means
to the rest of the worker, and the path real attempts of each kind take through it.

The paths are read from a real worker on a real database: every ``Slot.move`` is
recorded. A worker that skipped a state (a staged slot kept taken until its outcome
is written, a handler given up on whose slot is left taken) takes a different path,
and the test names which.
"""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    JobStatus,
    JobTypeRegistry,
    RetryPolicy,
    create_in_process_worker,
)
from pgwork.adapters.state import AcquiredJob
from pgwork.worker._slot import OCCUPYING, TRANSITIONS, Slot, SlotState, SlotStateError

from .conftest import ClientFactory, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

S = SlotState
NO_BACKOFF = RetryPolicy(initial=timedelta(0), maximum=timedelta(0))
LEASE = timedelta(seconds=60)


class Num(BaseModel):
    n: int


# --- the table ------------------------------------------------------------------------


class _Owner:
    """Records which slots a move gave their place up for."""

    def __init__(self) -> None:
        self.places: list[Slot] = []

    def freed(self, slot: Slot) -> None:
        self.places.append(slot)

    def settled(self, slot: Slot, then: Coroutine[Any, Any, None] | None) -> None:
        raise AssertionError("not used here")


def _slot(owner: _Owner, state: SlotState = S.WAITING) -> Slot:
    now = datetime.now(UTC)
    registry = JobTypeRegistry()
    job_type = registry.job_type("step", input=Num, lease=LEASE)
    acquired = AcquiredJob(
        id=uuid.uuid4(),
        type_name="step",
        chain_id=uuid.uuid4(),
        chain_type_name="step",
        chain_index=0,
        input={"n": 1},
        queue="default",
        priority=0,
        attempt=1,
        max_attempts=3,
        lease_token=uuid.uuid4(),
        leased_until=now + LEASE,
        created_at=now,
        scheduled_at=now,
        last_attempt_error=None,
    )
    slot = Slot(acquired, job_type, owner=owner)
    slot.state = state
    return slot


def test_every_state_is_reached_from_waiting_and_ends_in_done_or_abandoned() -> None:
    assert set(TRANSITIONS) == set(SlotState)
    reached = {S.WAITING}
    frontier = [S.WAITING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                frontier.append(nxt)
    assert reached == set(SlotState)
    final = {state for state, moves in TRANSITIONS.items() if not moves}
    assert final == {S.DONE, S.ABANDONED}


@pytest.mark.parametrize(
    ("was", "to"),
    list(itertools.product(SlotState, SlotState)),
    ids=lambda state: state.value,
)
def test_a_slot_makes_exactly_the_moves_the_table_allows(was: SlotState, to: SlotState) -> None:
    owner = _Owner()
    slot = _slot(owner, was)
    if to in TRANSITIONS[was]:
        slot.move(to)
        assert slot.state is to
    else:
        with pytest.raises(SlotStateError, match=f"from {was.value} to {to.value}"):
            slot.move(to)
        assert slot.state is was
        assert owner.places == []


@pytest.mark.parametrize(
    ("was", "to"),
    [(was, to) for was, moves in TRANSITIONS.items() for to in moves],
    ids=lambda state: state.value,
)
def test_a_move_frees_the_place_exactly_when_it_leaves_the_place_holding_states(
    was: SlotState, to: SlotState
) -> None:
    owner = _Owner()
    slot = _slot(owner, was)
    slot.move(to)
    expected = [slot] if was in OCCUPYING and to not in OCCUPYING else []
    assert owner.places == expected


RENEWED = {
    # state: (renewed at once, renewed once a sixth of the lease went by in it)
    S.WAITING: (True, True),
    S.STARTING: (False, False),
    S.JOINING: (True, True),
    S.RUNNING: (True, True),
    S.FINISHING: (False, True),
    S.SETTLING: (False, True),
    S.ABANDONED: (False, True),
    S.DONE: (False, False),
}


@pytest.mark.parametrize("state", list(SlotState), ids=lambda state: state.value)
def test_the_lease_is_renewed_in_the_states_that_hold_the_job_for_long(
    state: SlotState,
) -> None:
    slot = _slot(_Owner(), state)
    slot.since = 1000.0
    at_once, later = RENEWED[state]
    assert slot.lease_renewed(1000.0) is at_once
    assert slot.lease_renewed(1000.0 + LEASE.total_seconds() / 6 + 0.001) is later


# --- the paths real attempts take -----------------------------------------------------


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> dict[UUID, list[str]]:
    """Every move of every slot, by job id, as the worker makes them."""
    moves: dict[UUID, list[str]] = defaultdict(list)
    move = Slot.move

    def recording(self: Slot, to: SlotState) -> None:
        move(self, to)
        moves[self.acquired.id].append(to.value)

    monkeypatch.setattr(Slot, "move", recording)
    return moves


STAGED = ["starting", "running", "settling", "done"]
ALONE = ["starting", "running", "finishing", "done"]
GROUPED = ["starting", "joining", "running", "finishing", "settling", "done"]


@pytest.mark.parametrize(
    ("mode", "group", "outcome", "path"),
    [
        ("staged", 1, "returns", STAGED),
        ("staged", 1, "raises", STAGED),
        ("atomic", 1, "returns", ALONE),
        ("atomic", 1, "raises", ALONE),
        ("atomic", 4, "returns", GROUPED),  # wrote nothing: left with the batcher
        ("atomic", 4, "writes", GROUPED),  # kept in its group until it commits
        (
            "atomic",
            4,
            "raises",
            ["starting", "joining", "running", "finishing", "settling", "done"],
        ),
    ],
)
async def test_each_kind_of_attempt_takes_its_path_through_the_states(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    paths: dict[UUID, list[str]],
    mode: str,
    group: int,
    outcome: str,
    path: list[str],
) -> None:
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num, mode=mode, retry=NO_BACKOFF, max_attempts=1)  # type: ignore[arg-type]
    client = await make_client(reg)

    async def handler(attempt: Attempt[Num, Any]) -> str:
        if outcome == "raises":
            raise ValueError("failed on purpose")
        if outcome == "writes":
            await attempt.connection.execute("SELECT 1")
        return "ok"

    worker = create_in_process_worker(
        client=client,
        processors={step: handler},
        max_slots=2,
        poll_interval=0.1,
        atomic_group=group,
    )
    async with worker:
        started = await client.start_chain(conn, step, Num(n=1))
        await conn.commit()

        async def ended() -> bool:
            job = await client.get_job(started.job_id)
            return job.status in (JobStatus.COMPLETED, JobStatus.FAILED)

        await eventually(ended, what="the job to end")
        await eventually(lambda: _done(paths, started.job_id), what="its slot to be let go")
    assert paths[started.job_id] == path


async def _done(paths: dict[UUID, list[str]], job_id: UUID) -> bool:
    return bool(paths[job_id]) and paths[job_id][-1] in ("done", "abandoned")


async def test_a_handler_given_up_on_frees_its_slot_and_stays_abandoned(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    paths: dict[UUID, list[str]],
) -> None:
    reg = JobTypeRegistry()
    stuck = reg.job_type(
        "stuck",
        input=Num,
        timeout=timedelta(milliseconds=200),
        abandon_after=timedelta(milliseconds=200),
        retry=NO_BACKOFF,
        max_attempts=1,
    )
    quick = reg.job_type("quick", input=Num)
    client = await make_client(reg)
    release = anyio.Event()

    async def hangs(attempt: Attempt[Num, Any]) -> str:
        with anyio.CancelScope(shield=True):
            await release.wait()
        return "late"

    async def returns(attempt: Attempt[Num, Any]) -> str:
        return "ok"

    worker = create_in_process_worker(
        client=client, processors={stuck: hangs, quick: returns}, max_slots=1, poll_interval=0.1
    )
    async with worker:
        started = await client.start_chain(conn, stuck, Num(n=1))
        await conn.commit()
        await eventually(lambda: _done(paths, started.job_id), what="the handler given up on")
        assert paths[started.job_id] == ["starting", "running", "abandoned"]
        # Its one slot runs the next job while the handler given up on still runs.
        after = await client.start_chain(conn, quick, Num(n=2))
        await conn.commit()
        await eventually(lambda: _done(paths, after.job_id), what="the next job in the slot")
        assert paths[after.job_id] == STAGED
        assert worker.abandoned_handlers == 1
        assert (await client.get_job(started.job_id)).status is JobStatus.FAILED
        release.set()
        await eventually(
            lambda: _count(worker.abandoned_handlers, 0), what="the handler to end late"
        )
    # Its late end moved nothing: the attempt was settled without it.
    assert paths[started.job_id] == ["starting", "running", "abandoned"]


async def _count(value: int, expected: int) -> bool:
    """For ``eventually``: ``value`` is read again at each call of the lambda."""
    return value == expected


async def test_a_job_waiting_for_a_slot_when_the_worker_stops_is_let_go_from_waiting(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    paths: dict[UUID, list[str]],
) -> None:
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num, retry=NO_BACKOFF)
    client = await make_client(reg)
    running = anyio.Event()
    release = anyio.Event()

    async def handler(attempt: Attempt[Num, Any]) -> str:
        running.set()
        await release.wait()
        return "ok"

    worker = create_in_process_worker(
        client=client, processors={step: handler}, max_slots=1, poll_interval=0.1, prefetch=1
    )
    stop = await worker.start()
    first = await client.start_chain(conn, step, Num(n=1))
    second = await client.start_chain(conn, step, Num(n=2))
    await conn.commit()
    await running.wait()
    await eventually(lambda: _waiting(worker, 1), what="the second job to be prefetched")
    waiting, running_id = (
        (second.job_id, first.job_id)
        if paths[first.job_id][:2] == ["starting", "running"]
        else (first.job_id, second.job_id)
    )
    async with anyio.create_task_group() as group:
        group.start_soon(stop)
        await eventually(lambda: _done(paths, waiting), what="the waiting job handed back")
        release.set()
    assert paths[waiting] == ["done"]
    assert paths[running_id] == STAGED
    assert (await client.get_job(waiting)).status is JobStatus.PENDING


async def _waiting(worker: Any, count: int) -> bool:
    return len(worker._slots.admission.queued) == count
