"""What ``pgwork history`` prints, from the real program in a process of its own."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator

import anyio
import pytest
from tests.engine.test_history import Ended, seed

from pgwork import Client, JobTypeRegistry, PostgresStateAdapter, create_client
from pgwork.adapters.history import duration_text

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(pgwork_dsn: str) -> AsyncIterator[Client]:
    state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=2)
    made = create_client(state_adapter=state, registry=JobTypeRegistry(), observers=[])
    yield made
    await made.close()


async def _cli(dsn: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PGWORK_DSN")}
    done = await anyio.run_process(
        [sys.executable, "-m", "pgwork.cli", "history", *args, "--dsn", dsn], env=env, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_history_prints_what_ended_per_queue_and_type(
    client: Client, pgwork_dsn: str
) -> None:
    assert "nothing counted yet" in await _cli(pgwork_dsn)
    await seed(
        pgwork_dsn,
        [Ended("mail", "send", "completed", 600.0, 0.2, 1.5) for _ in range(3)]
        + [Ended("default", "report", "failed", 900.0, 0.02, 40.0)],
    )
    assert (await client.roll_up_history()).jobs == 4

    document = json.loads(await _cli(pgwork_dsn, "--json", "--window", "7d"))
    assert (document["completed"], document["failed"]) == (3, 1)
    groups = {(g["queue"], g["type_name"]): g for g in document["groups"]}
    assert groups[("mail", "send")]["completed"] == 3
    assert groups[("mail", "send")]["run"]["max_s"] == pytest.approx(1.5)
    # Its bin (10 to 50 ms) caps the percentile at 50 ms; the longest wait is lower.
    assert groups[("default", "report")]["wait"]["p95_s"] == pytest.approx(0.02)
    assert sum(p["failed"] for p in document["points"]) == 1

    text = await _cli(pgwork_dsn, "--queue", "mail")
    assert "last day: 3 completed, 0 failed; counted up to" in text
    row = next(line for line in text.splitlines() if line.startswith("mail"))
    assert row.split()[:4] == ["mail", "send", "3", "0"]
    assert row.split()[-2:] == ["1.5", "s"]  # the longest run


def test_a_duration_reads_in_the_unit_that_suits_it() -> None:
    """The table here and the dashboard's history page share this text."""
    values = [None, 0.004, 2.5, 192.0, 9000.0]

    assert [duration_text(v) for v in values] == ["-", "4 ms", "2.5 s", "3.2 min", "2.5 h"]
    assert duration_text(None, missing="–") == "–"
