"""A worker killed between a hand-on's commit and its match loses nothing: the step
it wrote waits, the signal stays pending, and another worker's sweep (as it starts)
delivers it; the step runs once, and in atomic mode its effect commits once.

The victim (``_victim``) is a worker process whose match is a SIGKILL. The control
build's second worker sweeps nothing: the step then never starts.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from tests.engine.conftest import eventually

from pgwork.worker._side.maintenance import Maintenance

from ._kit import Order, Shop, pending_signals, send, start_order, step_statuses
from ._ledger import TABLES, hand_on, ship

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

REPO = Path(__file__).resolve().parents[2]
PROMPT = 10.0


async def _rows(dsn: str, table: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(f"SELECT type_name, count(*) FROM {table} GROUP BY type_name")
        return {name: count for name, count in await cur.fetchall()}


async def _killed(dsn: str, mode: str) -> int:
    """Run the victim until it dies; its return code."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.signals._victim", dsn, mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        await anyio.to_thread.run_sync(proc.wait, 40)
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert "ready" in output, output
    return proc.returncode


@pytest.mark.parametrize("build", ["swept", "control-unswept"])
@pytest.mark.parametrize("mode", ["staged", "atomic"])
async def test_a_worker_killed_before_matching_its_hand_on_loses_nothing(
    pgwork_dsn: str,
    make_client: Any,
    workers: Any,
    mode: str,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        await conn.execute(TABLES)
    shop = Shop(order_mode=mode, ship_mode=mode)
    client = await make_client(shop.registry)
    await send(pgwork_dsn, client, shop, "k-1", 21)  # the signal is there first
    await start_order(pgwork_dsn, client, shop, Order(id="k-1"))

    assert await _killed(pgwork_dsn, mode) == -signal.SIGKILL
    # The hand-on committed; its match never ran.
    assert await step_statuses(pgwork_dsn, "payment:k-1") == ["blocked"]
    assert await pending_signals(pgwork_dsn) == ["payment:k-1"]
    assert await _rows(pgwork_dsn, "signal_ledger") == {"order": 1}

    if build == "control-unswept":

        async def nothing(self: Any) -> int:
            return 0

        monkeypatch.setattr(Maintenance, "sweep_signals", nothing)
    second = await workers(
        client=client,
        processors={shop.order: hand_on(pgwork_dsn, shop), shop.ship: ship(pgwork_dsn, shop)},
    )

    async def shipped() -> bool:
        return (await _rows(pgwork_dsn, "signal_ledger")).get("ship", 0) >= 1

    with contextlib.suppress(AssertionError):
        await eventually(shipped, timeout=PROMPT, what="the step's run")
    if build == "control-unswept":
        assert not await shipped()
        assert await step_statuses(pgwork_dsn, "payment:k-1") == ["blocked"]
        return
    await anyio.sleep(1.0)  # room for a second run, should there be one
    assert await _rows(pgwork_dsn, "signal_ledger") == {"order": 1, "ship": 1}
    if mode == "atomic":
        assert await _rows(pgwork_dsn, "signal_effects") == {"order": 1, "ship": 1}
    assert second._maintenance.swept == 1  # delivered by the sweep
    assert second._matcher.delivered == 0
    assert await pending_signals(pgwork_dsn) == []
    assert await step_statuses(pgwork_dsn) == ["completed"]
