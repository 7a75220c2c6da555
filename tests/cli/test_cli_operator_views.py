"""What ``pgwork queues``, ``jobs list`` and ``workers`` print, from the real program in a
process of its own, its output piped as a script reads it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Client,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.adapters.state import WorkerInfo

pytestmark = pytest.mark.anyio

LONG_TYPE = "reconcile_customer_invoices_against_the_nightly_ledger_export"
LONG_QUEUE = "accounting-reconciliation-nightly-batch"


class Item(BaseModel):
    n: int


registry = JobTypeRegistry()
reconcile = registry.job_type(LONG_TYPE, input=Item, queue=LONG_QUEUE)
handled = registry.job_type("handled", input=Item, queue="work")
forgotten = registry.job_type("forgotten", input=Item, queue="work")
orphan = registry.job_type("orphan", input=Item, queue="orphans")


async def handle(attempt: Attempt[Item, Any]) -> None:
    return None


@pytest.fixture
async def client(pgwork_dsn: str) -> AsyncIterator[Client]:
    c = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=registry,
        observers=[],
    )
    yield c
    await c.close()


async def _cli(dsn: str, *args: str, columns: str | None = None) -> str:
    """Run ``pgwork ARGS --dsn DSN`` with stdout piped; its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PGWORK_DSN")}
    if columns is not None:
        env["COLUMNS"] = columns
    done = await anyio.run_process(
        [sys.executable, "-m", "pgwork.cli", *args, "--dsn", dsn], env=env, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def _enqueue(client: Client, dsn: str, job_type: Any, count: int) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started = [await client.start_chain(conn, job_type, Item(n=n)) for n in range(count)]
        await conn.commit()
    return [str(s.job_id) for s in started]


async def test_piped_jobs_list_prints_whole_rows(client: Client, pgwork_dsn: str) -> None:
    ids = await _enqueue(client, pgwork_dsn, reconcile, 3)

    out = await _cli(pgwork_dsn, "jobs", "list")

    for job_id in ids:
        row = next(line for line in out.splitlines() if line.startswith(job_id))
        assert row.split()[:4] == [job_id, "pending", LONG_TYPE, LONG_QUEUE]


async def test_jobs_list_in_a_narrow_width_keeps_the_ids_whole(
    client: Client, pgwork_dsn: str
) -> None:
    ids = await _enqueue(client, pgwork_dsn, reconcile, 3)

    out = await _cli(pgwork_dsn, "jobs", "list", columns="80")

    assert all(len(line) <= 80 for line in out.splitlines())
    for job_id in ids:
        assert any(line.startswith(f"{job_id} ") for line in out.splitlines()), out


async def test_queues_once_all_work_is_done_says_the_queues_are_empty(
    client: Client, pgwork_dsn: str
) -> None:
    [job_id] = await _enqueue(client, pgwork_dsn, handled, 1)
    async with create_in_process_worker(client=client, processors={handled: handle}):
        await client.await_chain(UUID(job_id), timeout=30)  # a lone job is its own chain

    out = await _cli(pgwork_dsn, "queues")

    assert "nothing was enqueued" not in out
    assert "every queue is empty" in out


async def test_queues_warns_of_ready_work_no_live_worker_takes(
    client: Client, pgwork_dsn: str
) -> None:
    await _enqueue(client, pgwork_dsn, handled, 1)
    await _enqueue(client, pgwork_dsn, forgotten, 2)
    await _enqueue(client, pgwork_dsn, orphan, 1)
    worker = create_in_process_worker(client=client, processors={handled: handle})
    async with worker:
        out = await _cli(pgwork_dsn, "queues")
        as_json = json.loads(await _cli(pgwork_dsn, "queues", "--json"))

    assert (
        "warning: queue 'work': job type 'forgotten' is pending, but no live worker "
        "taking from this queue handles it"
    ) in out
    assert "warning: queue 'orphans': 1 ready, but no live worker takes jobs from it" in out
    assert "'handled'" not in out
    assert [(u["queue"], u["job_type"]) for u in as_json["unhandled"]] == [
        ("orphans", None),
        ("work", "forgotten"),
    ]


async def test_workers_shows_a_cleanly_stopped_worker_as_stopped_not_dead(
    client: Client, pgwork_dsn: str
) -> None:
    async with create_in_process_worker(
        client=client, processors={handled: handle}, worker_id="stopped-cleanly"
    ):
        pass
    await client.state.register_worker(
        worker=WorkerInfo(
            id="went-silent", host="box", pid=7, queues=("work",), job_types=(), max_slots=1
        )
    )

    out = await _cli(pgwork_dsn, "workers", "--dead-after", "0.000001")

    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rows["stopped-cleanly"].rstrip().endswith("stopped")
    assert "dead" not in rows["stopped-cleanly"]
    assert rows["went-silent"].rstrip().endswith("no (dead)")
