"""``pgwork limits`` (the table, --json, set, pause, resume) on real PostgreSQL.

The command has no registry: it knows what a type declares from the workers'
registrations, recorded here as a worker records them when it starts, or by a worker
that runs. Control of the rate's use: with the type's starts counted in the group of
the jobs without a key only (as a type limited as a whole records them), the test of
the started attempts reads 0 for the type."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from tests.cli._run import run

from pgwork import (
    Attempt,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    Rate,
    create_client,
    create_in_process_worker,
)
from pgwork.adapters.state import WorkerInfo
from pgwork.cli import EXIT_ERROR
from pgwork.client import limits_metadata


class Item(BaseModel):
    n: int


def _registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("call", input=Item, concurrency=4, key_concurrency=2)
    reg.job_type("export", input=Item, concurrency=1)
    reg.job_type("plain", input=Item)
    # Ten an hour in all, two an hour per key: nothing leaves its window in a test.
    reg.job_type(
        "fetch",
        input=Item,
        rate=Rate(10, per=timedelta(hours=1)),
        key_rate=Rate(2, per=timedelta(hours=1)),
    )
    return reg


def _declare(dsn: str, *, keys: Sequence[str | None] = ()) -> None:
    """A worker running the four types registers, and jobs of ``call`` wait."""
    reg = _registry()

    async def go() -> None:
        state = await PostgresStateAdapter.connect(dsn)
        client = create_client(
            state_adapter=state,
            notify_adapter=PostgresNotifyAdapter(dsn),
            registry=reg,
            observers=[],
        )
        try:
            await state.register_worker(
                worker=WorkerInfo(
                    id="w-1",
                    host="h",
                    pid=1,
                    queues=("default",),
                    job_types=tuple(t.name for t in reg),
                    max_slots=4,
                    metadata=limits_metadata({t.name: t for t in reg}),
                )
            )
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                for n, key in enumerate(keys):
                    await client.start_chain(conn, reg.get("call"), Item(n=n), limit_key=key)
                await conn.commit()
        finally:
            await client.close()

    anyio.run(go)


def limits_json(runner: CliRunner, dsn: str) -> dict[str, Any]:
    result = run(runner, dsn, "limits", "--json")
    assert result.exit_code == 0, result.output
    return {t["job_type"]: t for t in json.loads(result.stdout)["limits"]}


def test_limits_lists_each_limited_type_with_what_it_declares(
    runner: CliRunner, pgwork_dsn: str
) -> None:
    _declare(pgwork_dsn, keys=["a", "a", None])

    found = limits_json(runner, pgwork_dsn)

    assert sorted(found) == ["call", "export", "fetch"]
    call = found["call"]
    assert call["declared"] == {
        "concurrency": 4,
        "key_concurrency": 2,
        "rate": None,
        "key_rate": None,
    }
    assert call["effective"] == call["declared"]
    assert (call["running"], call["pending"], call["paused_until"]) == (0, 3, None)
    table = run(runner, pgwork_dsn, "limits")
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[0].split()[:3] == ["TYPE", "RUNNING", "LIMIT"]
    assert [line.split()[:3] for line in table.stdout.splitlines()[1:3]] == [
        ["call", "0", "4"],
        ["export", "0", "1"],
    ]


def _run_fetch(dsn: str, keys: Sequence[str | None]) -> None:
    """A worker of ``fetch`` runs a job of each of ``keys`` to its end."""
    reg = _registry()

    async def done(attempt: Attempt[Item, Any]) -> None:
        return None

    async def go() -> None:
        client = create_client(
            state_adapter=await PostgresStateAdapter.connect(dsn),
            notify_adapter=PostgresNotifyAdapter(dsn),
            registry=reg,
            observers=[],
        )
        worker = create_in_process_worker(
            client=client, processors={reg.get("fetch"): done}, observers=[]
        )
        try:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                chains = [
                    await client.start_chain(conn, reg.get("fetch"), Item(n=n), limit_key=key)
                    for n, key in enumerate(keys)
                ]
                await conn.commit()
            async with worker:
                for chain in chains:
                    await client.await_chain(chain.id, timeout=30)
        finally:
            await client.close()

    anyio.run(go)


def test_limits_shows_the_attempts_started_in_each_rates_window(
    runner: CliRunner, pgwork_dsn: str
) -> None:
    """Three attempts of ``fetch`` ran: all three count against its rate, two against
    key ``a``'s and one against ``b``'s (ended, they are no longer running). A type
    without a rate has no count."""
    _declare(pgwork_dsn)
    _run_fetch(pgwork_dsn, ["a", "a", "b"])

    found = limits_json(runner, pgwork_dsn)

    fetch = found["fetch"]
    assert (fetch["running"], fetch["started"]) == (0, 3)
    assert fetch["effective"]["rate"] == {"n": 10, "per_seconds": 3600.0}
    assert {(k["limit_key"], k["started"], k["key_rate"]["n"]) for k in fetch["keys"]} == {
        ("a", 2, 2),
        ("b", 1, 2),
    }
    # The key at its rate first: the closest to its limits.
    assert fetch["keys"][0]["limit_key"] == "a"
    assert found["call"]["started"] is None
    table = run(runner, pgwork_dsn, "limits")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        *("TYPE", "RUNNING", "LIMIT", "KEY", "LIMIT", "STARTED"),
        *("RATE", "KEY", "RATE", "PENDING", "PAUSED"),
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["fetch"][:7] == ["fetch", "0", "-", "-", "3", "10/1h", "2/1h"]
    key_a = next(line.split() for line in lines if line.split()[:2] == ["key", "a"])
    assert key_a[:6] == ["key", "a", "0", "-", "2", "2/1h"]


def test_set_overrides_and_reset_returns_to_the_declaration(
    runner: CliRunner, pgwork_dsn: str
) -> None:
    _declare(pgwork_dsn)

    done = run(runner, pgwork_dsn, "limits", "set", "call", "--concurrency", "9")
    assert done.exit_code == 0, done.output
    done = run(runner, pgwork_dsn, "limits", "set", "fetch", "--rate", "5/1s")
    assert done.exit_code == 0, done.output
    assert (
        run(
            runner, pgwork_dsn, "limits", "set", "call", "--key", "t", "--key-concurrency", "1"
        ).exit_code
        == 0
    )
    call = limits_json(runner, pgwork_dsn)["call"]
    assert call["effective"]["concurrency"] == 9
    assert limits_json(runner, pgwork_dsn)["fetch"]["effective"]["rate"] == {
        "n": 5,
        "per_seconds": 1.0,
    }
    assert [(k["limit_key"], k["key_concurrency"]) for k in call["keys"]] == [("t", 1)]
    assert "9*" in run(runner, pgwork_dsn, "limits").stdout

    assert run(runner, pgwork_dsn, "limits", "set", "call", "--reset", "all").exit_code == 0
    call = limits_json(runner, pgwork_dsn)["call"]
    assert call["override"]["concurrency"] is None
    assert call["effective"]["concurrency"] == 4


def test_pause_and_resume_a_key(runner: CliRunner, pgwork_dsn: str) -> None:
    _declare(pgwork_dsn)

    paused = run(runner, pgwork_dsn, "limits", "pause", "call", "--key", "t", "--for", "10m")
    assert paused.exit_code == 0, paused.output
    [key] = limits_json(runner, pgwork_dsn)["call"]["keys"]
    assert key["limit_key"] == "t"
    assert key["paused_until"] is not None
    assert (
        run(
            runner, pgwork_dsn, "limits", "pause", "export", "--until", "2099-01-01T00:00:00+00:00"
        ).exit_code
        == 0
    )
    assert limits_json(runner, pgwork_dsn)["export"]["paused_until"].startswith("2099-01-01")

    assert run(runner, pgwork_dsn, "limits", "resume", "call", "--key", "t").exit_code == 0
    assert run(runner, pgwork_dsn, "limits", "resume", "export").exit_code == 0
    found = limits_json(runner, pgwork_dsn)
    assert found["call"]["keys"] == []
    assert found["export"]["paused_until"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("set", "nobody", "--concurrency", "2"), "no flow limits are known for job type 'nobody'"),
        (("set", "plain", "--concurrency", "2"), "declares no flow limit"),
        (("set", "export", "--key", "t", "--key-concurrency", "2"), "declares no per-key limit"),
        (("set", "call", "--concurrency", "0"), "concurrency of set_limits must be"),
        (("set", "call", "--rate", "fast"), "is not a rate"),
        (("set", "call", "--rate", "0/1s"), "'0/1s' is out of bounds"),
        (("pause", "call", "--for", "soon"), "is not a duration"),
        (("pause", "call", "--until", "2099-01-01T00:00:00"), "timezone-aware"),
        (("pause", "call", "--until", "2001-01-01T00:00:00+00:00"), "later than now"),
    ],
)
def test_a_refused_change_is_one_line_and_exit_status_2(
    runner: CliRunner, pgwork_dsn: str, args: tuple[str, ...], message: str
) -> None:
    _declare(pgwork_dsn)

    result = run(runner, pgwork_dsn, "limits", *args)

    assert result.exit_code == EXIT_ERROR, result.output
    assert message in " ".join(result.stderr.split())
    assert limits_json(runner, pgwork_dsn)["call"]["override"]["concurrency"] is None
