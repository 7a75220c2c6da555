"""What the fan-out tests share: a batch whose ``split`` starts one ``part`` chain per
item and hands on to ``collect``, which waits for them and reads their outputs.

``Batch.fail_at`` names the part that fails (``max_attempts=1``: for good), ``need``
the ``Children(..., need=)``; ``collect``'s type carries the blocker policy under test.
``Recorder`` counts each handler's runs and keeps what ``collect`` read.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
from pydantic import BaseModel

from pgwork import Attempt, Children, Client, Continue, JobTypeRegistry, PostgresStateAdapter
from pgwork.backoff import RetryPolicy
from pgwork.job_types import BlockerFailurePolicy, JobType, ProcessingMode

__all__ = [
    "Batch",
    "Done",
    "FanOut",
    "Part",
    "RefusedOnce",
    "Summary",
    "children_apart",
    "rows",
    "start",
    "statuses",
]


class Batch(BaseModel):
    id: str
    size: int
    fail_at: int | None = None
    need: int | None = None


class Part(BaseModel):
    batch: str
    index: int
    fail: bool = False


class Done(BaseModel):
    index: int


class Summary(BaseModel):
    read: int
    missing: int


class FanOut:
    """One registry: ``part`` (entry, ``part_attempts``), ``collect`` (its policy) and
    ``split`` (continues with ``collect``; retried at once), each in the mode given;
    ``lease_s`` is the lease of ``split`` and ``part``. The handlers record what ran."""

    def __init__(
        self,
        *,
        policy: BlockerFailurePolicy = "fail",
        split_mode: ProcessingMode = "staged",
        collect_mode: ProcessingMode = "staged",
        part_mode: ProcessingMode = "staged",
        lease_s: float = 60.0,
        part_attempts: int = 1,
    ) -> None:
        self.registry = JobTypeRegistry()
        lease = timedelta(seconds=lease_s)
        self.part: JobType[Part, Done] = self.registry.job_type(
            "part",
            input=Part,
            output=Done,
            max_attempts=part_attempts,
            queue="parts",
            mode=part_mode,
            lease=lease,
        )
        self.collect: JobType[Batch, Summary] = self.registry.job_type(
            "collect",
            input=Batch,
            output=Summary,
            entry=False,
            blocker_failure=policy,
            mode=collect_mode,
            queue="collect",
        )
        self.split: JobType[Batch, Any] = self.registry.job_type(
            "split",
            input=Batch,
            continue_with=[self.collect],
            mode=split_mode,
            lease=lease,
            retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
        )
        self.runs: Counter[str] = Counter()
        self.read: list[list[Done | None]] = []
        self._collected = anyio.Event()

    async def do_split(self, attempt: Attempt[Batch, Any]) -> Continue[Batch]:
        self.runs["split"] += 1
        batch = attempt.job.input
        children = [
            attempt.start_chain(self.part, Part(batch=batch.id, index=i, fail=i == batch.fail_at))
            for i in range(batch.size)
        ]
        return Continue(self.collect, batch, wait_for=Children(children, need=batch.need))

    async def do_part(self, attempt: Attempt[Part, Done]) -> Done:
        self.runs["part"] += 1
        if attempt.job.input.fail:
            raise RuntimeError(f"part {attempt.job.input.index} failed")
        return Done(index=attempt.job.input.index)

    async def do_collect(self, attempt: Attempt[Batch, Summary]) -> Summary:
        self.runs["collect"] += 1
        outputs = await attempt.blocker_outputs(self.part)
        self.read.append(outputs)
        self._collected.set()
        return Summary(
            read=sum(o is not None for o in outputs), missing=sum(o is None for o in outputs)
        )

    def processors(self) -> dict[Any, Any]:
        return {self.split: self.do_split, self.part: self.do_part, self.collect: self.do_collect}

    async def collected(self, seconds: float) -> bool:
        with anyio.move_on_after(seconds):
            await self._collected.wait()
            return True
        return False


async def start(dsn: str, client: Client, fan: FanOut, batch: Batch) -> UUID:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started = await client.start_chain(conn, fan.split, batch)
        await conn.commit()
    return started.id


async def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params or None)
        return [tuple(row) for row in await cur.fetchall()]


async def statuses(dsn: str, type_name: str) -> Counter[str]:
    """How many jobs of ``type_name`` are in each status."""
    found = await rows(
        dsn,
        "SELECT status::text, count(*) FROM pgwork.jobs WHERE type_name = %s GROUP BY 1",
        type_name,
    )
    return Counter({status: count for status, count in found})


def children_apart() -> Any:
    """The control build of the tests that kill or roll back a fan-out: the state
    adapter's ``insert_jobs`` (to set on ``PostgresStateAdapter``) committing new chains
    of ``part`` (children) in a transaction of their own, not in the completion's."""
    insert = PostgresStateAdapter.insert_jobs

    async def insert_jobs(self: Any, tx: Any, *, jobs: Any, notify: Any = None) -> Any:
        jobs = list(jobs)
        if jobs and all(job.type_name == "part" and job.id == job.chain_id for job in jobs):
            async with self.transaction() as own:
                return await insert(self, own, jobs=jobs, notify=notify)
        return await insert(self, tx, jobs=jobs, notify=notify)

    return insert_jobs


class RefusedOnce:
    """An atomic ``split`` handler whose first attempt is refused at its COMMIT: it
    writes a row that a deferred constraint of ``TABLE`` refuses only then, after the
    completion wrote its ``size`` children and its step in the same transaction. The
    retry writes the row once and fans out again. ``started`` holds the ids of the
    children each attempt started, by attempt number."""

    TABLE = """
    CREATE TABLE fan_once (
        k int NOT NULL,
        CONSTRAINT fan_once_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED
    )
    """

    def __init__(self, fan: FanOut, size: int) -> None:
        self.fan = fan
        self.size = size
        self.started: dict[int, set[UUID]] = {}

    async def create(self, dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(self.TABLE)

    async def __call__(self, attempt: Attempt[Batch, Any]) -> Continue[Batch]:
        await attempt.connection.execute("INSERT INTO fan_once VALUES (1)")
        if not self.started:
            await attempt.connection.execute("INSERT INTO fan_once VALUES (1)")
        batch = attempt.job.input
        kids = [
            attempt.start_chain(self.fan.part, Part(batch=batch.id, index=i))
            for i in range(self.size)
        ]
        self.started[attempt.job.attempt] = {kid.id for kid in kids}
        return Continue(self.fan.collect, batch, wait_for=Children(kids))
