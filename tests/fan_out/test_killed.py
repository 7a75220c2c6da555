"""A worker killed in the middle of a fan-out loses nothing and doubles nothing.

Killed inside the transaction that completes the parent, once its children are written
and before the step: nothing of it commits (the children neither), the parent's lease
runs out, another worker runs it again, and its children exist once; in atomic mode the
parent's effect commits once. The control build commits the children in a transaction
of their own: the kill leaves them behind, and the retry's children come on top.

Killed between a child's end and its settling on the step: the child's end is
committed but not counted. Another worker's blocker sweep (as it starts) counts it, and
the step runs once; in atomic mode each child's effect commits once. The control build's
worker sweeps nothing: the step then never starts.

The victim (``_victim``) is a worker process whose kill point is a SIGKILL; the ledger
(``tests._victims``) counts what ran and what committed.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import anyio
import pytest
from tests._victims import Ledger, killed
from tests.engine.conftest import eventually

from pgwork.job_types import ProcessingMode
from pgwork.worker._side.maintenance import Maintenance

from ._kit import Batch, FanOut, Summary, rows, start, statuses
from ._victim import LEASE_S, LEDGER, handlers

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

# Past COPY_MIN_ROWS: the children go by COPY.
MANY = 300
FEW = 20


async def _killed(dsn: str, mode: str, point: str, *, control: bool = False) -> int:
    """Run the victim until it dies; its return code."""
    args = [dsn, mode, point, *(["control"] if control else [])]
    return await killed("tests.fan_out._victim", *args, timeout=60)


def _fan(mode: ProcessingMode) -> FanOut:
    return FanOut(
        split_mode=mode, part_mode=mode, collect_mode=mode, lease_s=LEASE_S, part_attempts=3
    )


@pytest.mark.parametrize("build", ["one-transaction", "control-children-apart"])
@pytest.mark.parametrize("mode", ["staged", "atomic"])
async def test_a_parent_killed_mid_completion_fans_out_once_when_run_again(
    pgwork_dsn: str, make_client: Any, workers: Any, mode: ProcessingMode, build: str
) -> None:
    ledger = Ledger(pgwork_dsn, LEDGER)
    await ledger.create()
    fan = _fan(mode)
    client = await make_client(fan.registry)
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="k", size=MANY))

    control = build.startswith("control")
    assert await _killed(pgwork_dsn, mode, "completion", control=control) == -signal.SIGKILL
    assert await ledger.tally() == {"split": (1, 1)}
    assert await statuses(pgwork_dsn, "collect") == {}
    assert await statuses(pgwork_dsn, "split") == {"running": 1}
    if control:
        assert await statuses(pgwork_dsn, "part") == {"pending": MANY}
    else:
        assert await statuses(pgwork_dsn, "part") == {}

    # A pool of slots plus room: an atomic attempt holds one connection (docs/deploying.md).
    await workers(client=client, processors=handlers(pgwork_dsn, fan), max_slots=12)
    assert await client.await_chain(chain_id, timeout=60) == Summary(read=MANY, missing=0)
    await anyio.sleep(0.5)  # room for a second run of the step, should there be one
    parts = await statuses(pgwork_dsn, "part")
    if control:
        assert sum(parts.values()) == 2 * MANY  # the first attempt's children, and the retry's
        return
    assert parts == {"completed": MANY}
    ran = await ledger.tally()
    assert ran == {"split": (2, 1), "part": (MANY, MANY), "collect": (1, 1)}
    if mode == "atomic":
        effects = await ledger.tally(effects=True)
        assert effects == {"split": (1, 1), "part": (MANY, MANY), "collect": (1, 1)}


@pytest.mark.parametrize("build", ["swept", "control-unswept"])
@pytest.mark.parametrize("mode", ["staged", "atomic"])
async def test_a_worker_killed_before_settling_a_childs_end_loses_nothing(
    pgwork_dsn: str,
    make_client: Any,
    workers: Any,
    mode: ProcessingMode,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = Ledger(pgwork_dsn, LEDGER)
    await ledger.create()
    fan = _fan(mode)
    client = await make_client(fan.registry)
    processors = handlers(pgwork_dsn, fan)
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="s", size=FEW))
    first = await workers(client=client, processors={fan.split: processors[fan.split]})

    async def fanned_out() -> bool:
        return (await statuses(pgwork_dsn, "collect")) == {"blocked": 1}

    await eventually(fanned_out, what="the fan-out")
    await first.stop()

    assert await _killed(pgwork_dsn, mode, "settle") == -signal.SIGKILL
    ended = (await statuses(pgwork_dsn, "part")).get("completed", 0)
    assert ended >= 1
    [(met,)] = await rows(
        pgwork_dsn, "SELECT blockers_met FROM pgwork.jobs WHERE type_name = 'collect'"
    )
    assert met == 0  # ended, not counted

    if build == "control-unswept":

        async def nothing(self: Any) -> None:
            return None

        monkeypatch.setattr(Maintenance, "sweep", nothing)
    del processors[fan.split]
    await workers(client=client, processors=processors, max_slots=8)

    async def parts_done() -> bool:
        return (await statuses(pgwork_dsn, "part")) == {"completed": FEW}

    await eventually(parts_done, timeout=30, what="every child's end")
    if build == "control-unswept":
        with contextlib.suppress(TimeoutError):
            await client.await_chain(chain_id, timeout=3)
        assert await statuses(pgwork_dsn, "collect") == {"blocked": 1}
        return
    assert await client.await_chain(chain_id, timeout=30) == Summary(read=FEW, missing=0)
    await anyio.sleep(0.5)
    ran = await ledger.tally()
    assert ran["collect"] == (1, 1)
    assert ran["part"][1] == FEW
    if mode == "atomic":
        effects = await ledger.tally(effects=True)
        assert effects == {"split": (1, 1), "part": (FEW, FEW), "collect": (1, 1)}
