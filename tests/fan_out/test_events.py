"""The chains a handler starts are reported as the chains a client starts are: one
``job.enqueued`` each, with the same fields, from the worker, once the completion that
writes them committed.

An observer on the client (and so on its worker) records every event. A fan-out in
each mode (staged, atomic, a worker grouping atomic attempts) reports the parent the
client started and each child row once, and the step only as its parent's attempt
handed on to it (``attempt.completed``, ``continued``), as any hand-on is. The control
build reports no child, as before children were reported.

An atomic parent whose first attempt wrote its children and step and then had its
COMMIT refused (a deferred constraint) reports none of that attempt's children: they
never existed. The control build reports children as soon as their write returns,
before the commit: the rolled-back attempt's children are then reported too.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from pgwork import (
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
)
from pgwork.job_types import ProcessingMode
from pgwork.observability import ATTEMPT_COMPLETED, JOB_ENQUEUED, Event
from pgwork.worker._steps import AttemptSteps

from ._kit import Batch, FanOut, RefusedOnce, Summary, rows, start

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

PROMPT = 30.0
SIZE = 12


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_event(self, event: Event) -> None:
        self.events.append(event)

    def named(self, name: str, **fields: Any) -> list[Event]:
        return [
            e
            for e in self.events
            if e.name == name and all(e.fields.get(k) == v for k, v in fields.items())
        ]


async def _run(
    dsn: str,
    workers: Any,
    fan: FanOut,
    recorder: Recorder,
    processors: dict[Any, Any],
    **options: Any,
) -> Summary:
    """Run one batch of ``SIZE`` through a worker whose client (and so the worker)
    reports to ``recorder``; what ``collect`` returned."""
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn, max_size=20),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=fan.registry,
        observers=[recorder],
    )
    worker = await workers(client=client, processors=processors, **options)
    try:
        chain_id = await start(dsn, client, fan, Batch(id="b", size=SIZE))
        summary: Summary = await client.await_chain(chain_id, timeout=PROMPT)
    finally:
        await worker.stop()
        await client.close()
    [parent] = recorder.named(JOB_ENQUEUED, job_type="split")
    assert parent["chain_id"] == chain_id
    return summary


async def _part_ids(dsn: str) -> set[UUID]:
    return {
        row[0] for row in await rows(dsn, "SELECT id FROM pgwork.jobs WHERE type_name = 'part'")
    }


def _unreported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control build: a handler's children are not reported."""
    monkeypatch.setattr(AttemptSteps, "_report_children", lambda self, outcome: None)


def _reported_before_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control build: children reported as soon as their write returns accepted,
    inside an atomic attempt's transaction, before its COMMIT."""
    report = AttemptSteps._report_children
    write = AttemptSteps.write_outcome

    async def write_outcome(self: AttemptSteps, slot: Any, attempt: Any, tx: Any) -> bool:
        written = await write(self, slot, attempt, tx)
        if written:
            report(self, attempt.outcome)
        return written

    monkeypatch.setattr(AttemptSteps, "_report_children", lambda self, outcome: None)
    monkeypatch.setattr(AttemptSteps, "write_outcome", write_outcome)


@pytest.mark.parametrize("build", ["reported", "control-unreported"])
@pytest.mark.parametrize("mode", ["staged", "atomic", "grouped"])
async def test_each_child_a_handler_starts_is_reported_enqueued_once(
    pgwork_dsn: str, workers: Any, mode: str, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if build.startswith("control"):
        _unreported(monkeypatch)
    kind: ProcessingMode = "staged" if mode == "staged" else "atomic"
    fan = FanOut(split_mode=kind, part_mode=kind, collect_mode=kind)
    recorder = Recorder()
    options: dict[str, Any] = {"atomic_group": 4, "max_slots": 4} if mode == "grouped" else {}

    summary = await _run(pgwork_dsn, workers, fan, recorder, fan.processors(), **options)

    assert summary == Summary(read=SIZE, missing=0)
    [parent] = recorder.named(JOB_ENQUEUED, job_type="split")
    [handed_on] = recorder.named(ATTEMPT_COMPLETED, job_type="split")
    assert handed_on["outcome"] == "continued"
    assert handed_on["continued_with"] == "collect"
    assert recorder.named(JOB_ENQUEUED, job_type="collect") == []
    children = recorder.named(JOB_ENQUEUED, job_type="part")
    if build.startswith("control"):
        assert children == []
        return
    assert sorted(e["job_id"] for e in children) == sorted(await _part_ids(pgwork_dsn))
    for event in children:
        assert set(event.fields) == set(parent.fields)
        assert event["chain_id"] == event["job_id"]
        assert event["queue"] == "parts"
        assert event["deduplicated"] is False
        assert event["scheduled"] is False


@pytest.mark.parametrize("build", ["after-commit", "control-before-commit"])
async def test_the_children_of_an_attempt_rolled_back_at_commit_are_never_reported(
    pgwork_dsn: str, workers: Any, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if build.startswith("control"):
        _reported_before_commit(monkeypatch)
    fan = FanOut(split_mode="atomic")
    split = RefusedOnce(fan, SIZE)
    await split.create(pgwork_dsn)
    recorder = Recorder()

    summary = await _run(pgwork_dsn, workers, fan, recorder, fan.processors() | {fan.split: split})

    assert summary == Summary(read=SIZE, missing=0)
    started = split.started
    assert set(started) == {1, 2}
    assert await _part_ids(pgwork_dsn) == started[2]
    reported = [e["job_id"] for e in recorder.named(JOB_ENQUEUED, job_type="part")]
    if build.startswith("control"):
        assert set(reported) == started[1] | started[2]
        return
    assert sorted(reported) == sorted(started[2])
