"""Flow limits hold for atomic job types, an attempt per transaction and in groups.

An atomic attempt's job stays ``running`` until its transaction commits, and a
grouped member's until its group's commit, well after its handler returned and its
slot was freed: the limits count the job, so the place is taken until then. Two
workers in one process run a type with ``concurrency=2``, a keyed type with
``key_concurrency=1``, a type with a rate of three starts in 300 ms and, as the
control, a type without limits, all atomic; each handler writes an effect row through
its attempt's transaction (so a grouped member is kept in its group) and the test
counts in plain Python how many handlers ran at once. ``txid_current()`` in the effect
row tells which attempts shared a transaction: in groups, some did. The effect row
also bounds the attempt's start (``tests/_starts.py``): its acquire's transaction
start, read back from its lease, and the handler's first statement.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel
from tests._starts import most_started
from tests.engine.conftest import ClientFactory, eventually, scalar

from pgwork import ChainStart, JobTypeRegistry, Rate

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

KEYS: tuple[str | None, ...] = ("a", "b", "c", None)
EFFECTS = """
CREATE TABLE flow_effects (
    job_id uuid NOT NULL,
    type_name text NOT NULL,
    xact bigint NOT NULL,
    leased_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL
)
"""
RATE = Rate(3, per=timedelta(milliseconds=300))


class Item(BaseModel):
    n: int


class Overlap:
    """Writes its attempt's effect, then holds it a moment; records how many ran at
    once, per type and per (type, limit key)."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.running: Counter[tuple[str, str | None]] = Counter()
        self.by_type: Counter[str] = Counter()
        self.most_by_type: Counter[str] = Counter()
        self.most: Counter[tuple[str, str | None]] = Counter()

    async def __call__(self, attempt: Any) -> None:
        assert attempt.job.leased_until is not None
        await attempt.connection.execute(
            "INSERT INTO flow_effects (job_id, type_name, xact, leased_at, started_at)"
            " VALUES (%s, %s, txid_current(), %s, clock_timestamp())",
            (
                attempt.job.id,
                attempt.job.type_name,
                attempt.job.leased_until - attempt.job_type.lease,
            ),
        )
        name, group = attempt.job.type_name, (attempt.job.type_name, attempt.limit_key)
        self.running[group] += 1
        self.by_type[name] += 1
        self.most[group] = max(self.most[group], self.running[group])
        self.most_by_type[name] = max(self.most_by_type[name], self.by_type[name])
        try:
            await anyio.sleep(self.hold)
        finally:
            self.running[group] -= 1
            self.by_type[name] -= 1


@pytest.mark.parametrize("group", [1, 4], ids=["a transaction each", "groups of 4"])
async def test_limits_hold_for_atomic_attempts(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    group: int,
) -> None:
    """Every job completes with one effect; at most two ``capped`` attempts and one
    ``keyed`` attempt per key run at once, and at most three ``rated`` ones start in
    300 ms; the ``free`` type, without limits, runs more than two and starts more
    than three in 300 ms (the control; declaring no limit, the limited types run past
    theirs in the same run)."""
    reg = JobTypeRegistry()
    capped = reg.job_type("capped", input=Item, mode="atomic", concurrency=2)
    keyed = reg.job_type("keyed", input=Item, mode="atomic", key_concurrency=1)
    free = reg.job_type("free", input=Item, mode="atomic")
    rated = reg.job_type("rated", input=Item, mode="atomic", rate=RATE)
    client = await make_client(reg)
    await conn.execute(EFFECTS)
    items = []
    for n in range(12):
        items += [ChainStart(capped, Item(n=n)), ChainStart(free, Item(n=n))]
        items.append(ChainStart(rated, Item(n=n)))
        items += [ChainStart(keyed, Item(n=n), limit_key=key) for key in KEYS]
    await client.start_chains(conn, items)
    await conn.commit()
    # Long enough that the free type's attempts overlap on a loaded machine too.
    handler = Overlap(hold=0.2)

    for _ in range(2):
        # A group waits longer than a handler holds, so the members stay grouped.
        await workers(
            client=client,
            processors={capped: handler, keyed: handler, free: handler, rated: handler},
            max_slots=8,
            atomic_group=group,
            atomic_group_wait=0.1,
        )

    async def all_completed() -> bool:
        done = await scalar(
            pgwork_dsn, "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed'"
        )
        return bool(done == len(items))

    await eventually(all_completed, what="every job completed")
    effects = await scalar(
        pgwork_dsn, "SELECT count(DISTINCT job_id) * 1000 + count(*) FROM flow_effects"
    )
    largest = await scalar(
        pgwork_dsn,
        "SELECT max(n) FROM (SELECT count(*) AS n FROM flow_effects GROUP BY xact) AS t",
    )
    assert effects == len(items) * 1000 + len(items)  # each job once, with one effect
    # Not always two: a lane runs its group's members one after another, and a kept
    # member's job holds its place until its group commits.
    assert 1 <= handler.most_by_type["capped"] <= 2
    assert {key: n for (name, key), n in handler.most.items() if name == "keyed"} == {
        key: 1 for key in KEYS
    }
    assert handler.most_by_type["keyed"] > 1  # the keys ran side by side
    assert handler.most_by_type["free"] > 2  # the control
    assert (largest > 1) == (group > 1)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
        cur = await c.execute("SELECT type_name, leased_at, started_at FROM flow_effects")
        starts: dict[str, list[tuple[Any, Any]]] = {}
        for name, leased_at, started_at in await cur.fetchall():
            starts.setdefault(name, []).append((leased_at, started_at))
    assert most_started(starts["rated"], RATE.per) == RATE.n
    assert most_started(starts["free"], RATE.per) > RATE.n  # the control
