"""``pgwork chains show`` says what a chain's step waits for; ``pgwork chains waiting``
lists the chains that wait, ``pgwork signals list`` the signals no step has taken."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from tests.cli._run import run

from pgwork import (
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
)


class Order(BaseModel):
    id: str


class Paid(BaseModel):
    amount: int


registry = JobTypeRegistry()
payment = registry.signal("payment", payload=Paid)
ship = registry.job_type("ship", input=Order, entry=False, waits_for=payment)
order = registry.job_type("order", input=Order, continue_with=[ship])


@dataclass(frozen=True)
class Seeded:
    waiting: UUID  # its step waits for payment:o-7, for two days
    ready: UUID  # one job, ready: waits for nothing but a worker


def _seed(dsn: str) -> Seeded:
    """An order handed on (from outside a worker) to a step waiting for its payment,
    another order no worker has run, and a payment nothing waits for."""

    async def go() -> Seeded:
        client = create_client(
            state_adapter=await PostgresStateAdapter.connect(dsn),
            notify_adapter=PostgresNotifyAdapter(dsn),
            registry=registry,
            observers=[],
        )
        try:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                waits = await client.start_chain(conn, order, Order(id="o-7"))
                ready = await client.start_chain(conn, order, Order(id="o-8"))
                await conn.commit()
                step = Continue(
                    ship, Order(id="o-7"), wait_for=payment.named("o-7", timeout=timedelta(days=2))
                )
                await client.complete_job(conn, waits.job_id, continue_with=step)
                await client.signal(conn, payment, "early", Paid(amount=3))
                await conn.commit()
        finally:
            await client.close()
        return Seeded(waiting=waits.id, ready=ready.id)

    return anyio.run(go)


@pytest.fixture
def seeded(pgwork_dsn: str) -> Seeded:
    return _seed(pgwork_dsn)


def run_json(runner: CliRunner, dsn: str, *args: str) -> Any:
    result = run(runner, dsn, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_chains_show_prints_what_the_current_step_waits_for(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "chains", "show", str(seeded.waiting))

    assert result.exit_code == 0, result.output
    [line] = [row for row in result.stdout.splitlines() if row.startswith("waiting")]
    assert re.match(
        r"waiting +for signal 'payment:o-7' \(timeout in 1d 23h\); step 1 \(ship\) since "
        r"\d+s ago$",
        line.rstrip(),
    ), line
    # A chain whose job is ready waits for a worker only: no such line.
    ready = run(runner, pgwork_dsn, "chains", "show", str(seeded.ready))
    assert ready.exit_code == 0, ready.output
    assert not [row for row in ready.stdout.splitlines() if row.startswith("waiting")]


def test_chains_show_json_carries_the_wait(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    shown = run_json(runner, pgwork_dsn, "chains", "show", str(seeded.waiting))

    waiting = shown["waiting"]
    assert (waiting["kind"], waiting["signal"], waiting["type_name"]) == (
        "signal",
        "payment:o-7",
        "ship",
    )
    assert waiting["job_id"] == shown["jobs"][-1]["id"]
    assert waiting["until"] == shown["jobs"][-1]["scheduled_at"]
    assert waiting["description"] == "signal 'payment:o-7' (timeout in 1d 23h)"
    assert run_json(runner, pgwork_dsn, "chains", "show", str(seeded.ready))["waiting"] is None


def test_chains_waiting_lists_the_waiting_chains_with_their_filters(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "chains", "waiting")

    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["ID", "CHAIN", "TYPE", "STEP", "WAITS", "FOR", "WAITING", "STARTS"]
    [row] = rows
    assert row.split()[:6] == [str(seeded.waiting), "order", "1", "ship", "signal", "payment:o-7"]
    assert row.rstrip().endswith("in 1d 23h")

    listed = run_json(runner, pgwork_dsn, "chains", "waiting", "--signal-prefix", "payment:")
    assert [w["chain_id"] for w in listed["waiting"]] == [str(seeded.waiting)]
    assert listed["next_cursor"] is None
    assert run_json(runner, pgwork_dsn, "chains", "waiting", "--kind", "sleep")["waiting"] == []
    nothing = run(runner, pgwork_dsn, "chains", "waiting", "--type", "refund")
    assert "no chain waits" in nothing.stdout


def test_signals_list_prints_pending_signals_with_their_age(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "signals", "list")

    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "AGE", "STATE"]
    assert re.match(r"\S+ +payment:early +\d+s +pending$", row.rstrip()), row

    listed = run_json(runner, pgwork_dsn, "signals", "list", "--prefix", "payment:")
    [signal] = listed["signals"]
    assert (signal["name"], signal["payload"], signal["pending"]) == (
        "payment:early",
        {"amount": 3},
        True,
    )
    assert signal["age_seconds"] >= 0
    empty = run_json(runner, pgwork_dsn, "signals", "list", "--name", "payment:o-7")
    assert empty["signals"] == []


def test_a_signal_name_is_printed_without_its_control_characters(
    runner: CliRunner, pgwork_dsn: str
) -> None:
    """A key is the application's data: one holding a terminal escape or a line break
    is printed escaped, as ``chains show`` prints it, not sent to the terminal."""
    key = "o-9\x1b[2J\nx"

    async def go() -> None:
        client = create_client(
            state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
            notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
            registry=registry,
            observers=[],
        )
        try:
            async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
                started = await client.start_chain(conn, order, Order(id="o-9"))
                await conn.commit()
                step = Continue(ship, Order(id="o-9"), wait_for=payment.named(key))
                await client.complete_job(conn, started.job_id, continue_with=step)
                await client.signal(conn, payment, key, Paid(amount=1))
                await conn.commit()
        finally:
            await client.close()

    anyio.run(go)
    for args in (("chains", "waiting"), ("signals", "list")):
        result = run(runner, pgwork_dsn, *args)
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.stdout, args
        [_, row] = result.stdout.splitlines()
        assert "payment:o-9\\x1b[2J\\nx" in row, row
