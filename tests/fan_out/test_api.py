"""The fan-out API's edges: what is refused where it is built, before anything is
written; children written only with a successful completion; children nobody waits
for; a sync handler; a hand-on from outside any worker; a store without
``ChainBlockers``."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from tests._core_only import CoreOnly
from tests.engine.conftest import eventually

from pgwork import (
    AttemptAlreadyFinishedError,
    CapabilityMissingError,
    ChildNotStartedHereError,
    Children,
    ChildWaitNotAllowedError,
    ConfigurationError,
    Continue,
    InvalidOptionError,
    JobStatus,
    JobTypeRegistry,
    NotAnEntryTypeError,
    PayloadValidationError,
    PgworkError,
    StartedChain,
    SyncAttempt,
    UnknownJobTypeError,
)
from pgwork.backoff import RetryPolicy

from ._kit import Batch, Done, FanOut, Part, Summary, rows, start, statuses

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PROMPT = 20.0


def _handle() -> StartedChain[Any, Any]:
    fan = FanOut()
    return StartedChain(uuid4(), uuid4(), fan.part, False, JobStatus.PENDING)


def test_children_are_checked_where_they_are_built() -> None:
    one, two = _handle(), _handle()
    assert Children([one, two]).chain_ids == (one.id, two.id)
    assert Children([one, two, one]).chain_ids == (one.id, two.id)  # waited for once
    assert Children([one, two], need=2).need == 2
    for chains in ([], "ab", [uuid4()], [object()], None):
        with pytest.raises(InvalidOptionError, match="chains"):
            Children(chains)  # type: ignore[arg-type]
    for need in (0, 3, -1, True, 1.0, "1"):
        with pytest.raises(InvalidOptionError, match="need"):
            Children([one, two, one], need=need)  # type: ignore[arg-type]
    fan = FanOut()
    with pytest.raises(ConfigurationError, match="not both"):
        Continue(fan.collect, Batch(id="b", size=1), after=timedelta(1), wait_for=Children([one]))  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="Children"):
        Continue(fan.collect, Batch(id="b", size=1), wait_for=[one])  # type: ignore[call-overload]


async def test_start_chain_checks_each_child_before_anything_is_written(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    fan = FanOut()
    stranger = JobTypeRegistry().job_type("stranger", input=Part)
    caught: dict[str, PgworkError] = {}
    done = threading.Event()

    async def split(attempt: Any) -> None:
        tries = {
            "not an entry type": lambda: attempt.start_chain(fan.collect, Batch(id="b", size=1)),
            "another registry's type": lambda: attempt.start_chain(
                stranger, Part(batch="b", index=0)
            ),
            "input": lambda: attempt.start_chain(fan.part, {"batch": "b", "index": "x"}),
            "priority": lambda: attempt.start_chain(
                fan.part, Part(batch="b", index=0), priority=10**6
            ),
            "queue": lambda: attempt.start_chain(fan.part, Part(batch="b", index=0), queue=""),
            "context": lambda: attempt.start_chain(
                fan.part, Part(batch="b", index=0), context={"a": 1}
            ),
        }
        for name, attempt_it in tries.items():
            try:
                attempt_it()
            except PgworkError as exc:
                caught[name] = exc
        await attempt.complete(None)
        try:
            attempt.start_chain(fan.part, Part(batch="b", index=0))
        except PgworkError as exc:
            caught["after complete"] = exc
        done.set()

    client = await make_client(fan.registry)
    await workers(client=client, processors={fan.split: split})
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=1))
    await client.await_chain(chain_id, timeout=PROMPT)
    assert {name: type(exc) for name, exc in caught.items()} == {
        "not an entry type": NotAnEntryTypeError,
        "another registry's type": UnknownJobTypeError,
        "input": PayloadValidationError,
        "priority": InvalidOptionError,
        "queue": InvalidOptionError,
        "context": InvalidOptionError,
        "after complete": AttemptAlreadyFinishedError,
    }
    assert await statuses(pgwork_dsn, "part") == {}


@pytest.mark.parametrize("mistake", ["foreign-children", "signal-step"])
async def test_a_step_that_cannot_wait_for_the_children_fails_its_job_for_good(
    pgwork_dsn: str, make_client: Any, workers: Any, mistake: str
) -> None:
    fan = FanOut()
    signal = fan.registry.signal("paid", payload=Done)
    waiting = fan.registry.job_type("waiting", input=Batch, entry=False, waits_for=signal)
    wrong = fan.registry.job_type("wrong", input=Batch, continue_with=[fan.collect, waiting])
    client = await make_client(fan.registry)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        elsewhere = await client.start_chain(conn, fan.part, Part(batch="b", index=0))
        await conn.commit()

    async def hand_on(attempt: Any) -> Any:
        mine = attempt.start_chain(fan.part, Part(batch="b", index=1))
        if mistake == "foreign-children":
            return Continue(fan.collect, attempt.job.input, wait_for=Children([mine, elsewhere]))
        return Continue(waiting, attempt.job.input, wait_for=Children([mine]))

    await workers(client=client, processors={wrong: hand_on})
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        started = await client.start_chain(conn, wrong, Batch(id="b", size=1))
        await conn.commit()

    async def failed() -> bool:
        return (await client.get_job(started.id)).status is JobStatus.FAILED

    await eventually(failed, timeout=PROMPT, what="the failure")
    job = await client.get_job(started.id)
    assert job.attempt == 1  # not retried: the same code fails the same way
    assert job.last_attempt_error is not None
    expected = (
        ChildNotStartedHereError if mistake == "foreign-children" else ChildWaitNotAllowedError
    )
    assert expected.__name__ in job.last_attempt_error.type
    if mistake == "foreign-children":
        assert str(elsewhere.id) in job.last_attempt_error.message
    # Nothing of the outcome was written: the child it started neither.
    assert await statuses(pgwork_dsn, "part") == {"pending": 1}


async def test_a_failed_or_rescheduled_attempt_writes_none_of_its_children(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    fan = FanOut()
    retrying = fan.registry.job_type(
        "retrying",
        input=Batch,
        continue_with=[fan.collect],
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    started: list[list[Any]] = []

    async def split(attempt: Any) -> Any:
        kids = [attempt.start_chain(fan.part, Part(batch="b", index=i)) for i in range(3)]
        started.append(kids)
        if len(started) == 1:
            raise RuntimeError("fails after starting its children")
        if len(started) == 2:
            await attempt.reschedule(after=timedelta(0))
            return None
        return Continue(fan.collect, attempt.job.input, wait_for=Children(kids))

    client = await make_client(fan.registry)
    await workers(
        client=client,
        processors={retrying: split, fan.part: fan.do_part, fan.collect: fan.do_collect},
    )
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        chain = await client.start_chain(conn, retrying, Batch(id="b", size=3))
        await conn.commit()
    assert await client.await_chain(chain.id, timeout=PROMPT) == Summary(read=3, missing=0)
    assert len(started) == 3
    written = await rows(
        pgwork_dsn, "SELECT id FROM pgwork.jobs WHERE type_name = 'part' ORDER BY id"
    )
    assert [row[0] for row in written] == [kid.id for kid in started[2]]


async def test_children_nobody_waits_for_start_with_the_completion_and_keep_its_context(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    fan = FanOut()

    async def split(attempt: Any) -> str:
        attempt.start_chain(fan.part, Part(batch="b", index=0))
        attempt.start_chain(fan.part, Part(batch="b", index=1), limit_key="own", queue="other")
        return "split"

    client = await make_client(fan.registry)
    await workers(
        client=client,
        processors={fan.split: split, fan.part: fan.do_part},
        queues=["default", "parts", "other"],
    )
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        chain = await client.start_chain(
            conn, fan.split, Batch(id="b", size=2), context={"request": "r-1"}, limit_key="tenant"
        )
        await conn.commit()
    assert await client.await_chain(chain.id, timeout=PROMPT) == "split"

    async def ran() -> bool:
        return await statuses(pgwork_dsn, "part") == {"completed": 2}

    await eventually(ran, timeout=PROMPT, what="the children's runs")
    found = await rows(
        pgwork_dsn,
        "SELECT context, limit_key, queue, chain_has_dependants FROM pgwork.jobs"
        " WHERE type_name = 'part' ORDER BY id",
    )
    assert found == [
        ({"request": "r-1"}, "tenant", "parts", False),
        ({"request": "r-1"}, "own", "other", False),
    ]


async def test_a_hand_on_that_waits_for_nothing_writes_its_children_too(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    fan = FanOut()

    async def split(attempt: Any) -> Continue[Batch]:
        attempt.start_chain(fan.part, Part(batch="b", index=0))
        attempt.start_chain(fan.part, Part(batch="b", index=1))
        return Continue(fan.collect, attempt.job.input)

    client = await make_client(fan.registry)
    processors = fan.processors() | {fan.split: split}
    await workers(client=client, processors=processors)
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=2))
    # The step waits for nothing: it reads no blocker.
    assert await client.await_chain(chain_id, timeout=PROMPT) == Summary(read=0, missing=0)

    async def ran() -> bool:
        return await statuses(pgwork_dsn, "part") == {"completed": 2}

    await eventually(ran, timeout=PROMPT, what="the children's runs")


async def test_a_sync_handler_fans_out_and_its_step_reads_the_outputs(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    """The sync attempt hands each child's options on to the async one's, which checks
    them: the children get them, and a keyword no child takes is refused."""
    fan = FanOut()
    threads: list[str] = []
    refused: list[str] = []

    def split(attempt: SyncAttempt[Batch, Any]) -> Continue[Batch]:
        threads.append(threading.current_thread().name)
        batch = attempt.job.input
        try:
            attempt.start_chain(fan.part, Part(batch=batch.id, index=0), queues="x")  # type: ignore[call-arg]
        except TypeError as exc:
            refused.append(str(exc))
        kids = [
            attempt.start_chain(
                fan.part, Part(batch=batch.id, index=i), priority=3, context={"tenant": "t"}
            )
            for i in range(4)
        ]
        return Continue(fan.collect, batch, wait_for=Children(kids, need=4))

    def collect(attempt: SyncAttempt[Batch, Summary]) -> Summary:
        outputs = attempt.blocker_outputs(fan.part)
        assert outputs == [Done(index=i) for i in range(4)]
        return Summary(read=len(outputs), missing=0)

    client = await make_client(fan.registry)
    await workers(
        client=client, processors={fan.split: split, fan.part: fan.do_part, fan.collect: collect}
    )
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=4))
    assert await client.await_chain(chain_id, timeout=PROMPT) == Summary(read=4, missing=0)
    assert threads[0].startswith("pgwork-sync-")
    [refusal] = refused
    assert "['queues']" in refusal
    children = await rows(
        pgwork_dsn, "SELECT priority, context FROM pgwork.jobs WHERE type_name = 'part'"
    )
    assert children == [(3, {"tenant": "t"})] * 4


async def test_a_hand_on_from_outside_any_worker_cannot_wait_for_children(
    pgwork_dsn: str, make_client: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    fan = FanOut()
    client = await make_client(fan.registry)
    started = await client.start_chain(conn, fan.split, Batch(id="b", size=1))
    child = await client.start_chain(conn, fan.part, Part(batch="b", index=0))
    await conn.commit()
    with pytest.raises(ChildNotStartedHereError, match="did not start"):
        await client.complete_job(
            conn,
            started.id,
            continue_with=Continue(fan.collect, Batch(id="b", size=1), wait_for=Children([child])),
        )
    # Refused before any write: the transaction goes on.
    await client.complete_job(conn, started.id, None)
    await conn.commit()
    assert (await client.get_job(started.id)).status is JobStatus.COMPLETED


async def test_a_store_without_blockers_refuses_children_in_the_handler(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    fan = FanOut()
    caught: list[PgworkError] = []

    async def split(attempt: Any) -> str:
        try:
            attempt.start_chain(fan.part, Part(batch="b", index=0))
        except CapabilityMissingError as exc:
            caught.append(exc)
        return "done"

    client = await make_client(fan.registry, store=CoreOnly)
    await workers(client=client, processors={fan.split: split})
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=1))
    assert await client.await_chain(chain_id, timeout=PROMPT) == "done"
    assert "ChainBlockers" in str(caught[0])
    assert await statuses(pgwork_dsn, "part") == {}
