"""The benchmark runs each library on the event loop it runs on in production: pgwork
on the one ``pgwork worker`` picks (uvloop when installed), in the harness and in its
worker processes alike; each peer on the one its own command line picks.

PgQueuer's ``pgq run`` and oban-py's ``oban start`` run on uvloop where it is
installed, and PgQueuer depends on it: a peer measured on asyncio's own loop is not at
its strongest, which flatters pgwork's ratios.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from bench._loop import current, resolve, run
from bench._worker_process import WorkerProcess
from bench.peers import FLOOR, PEERS
from bench.peers._peer_common import run_on_loop


async def _kind() -> str:
    return current()


def test_auto_picks_uvloop_where_it_is_installed() -> None:
    assert resolve("auto") == "uvloop"  # the benchmark depends on it
    assert resolve("asyncio") == "asyncio"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_harness_runs_on_the_loop_asked_for(loop: str) -> None:
    assert run(_kind(), loop) == loop


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_pgworks_worker_process_runs_on_the_harness_loop(pgwork_dsn: str, loop: str) -> None:
    async def spawn() -> str | None:
        child = await WorkerProcess.start(pgwork_dsn, slots=1)
        try:
            return child.loop
        finally:
            await child.stop()

    assert run(spawn(), loop) == loop


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_peer_runner_runs_on_the_loop_it_is_given(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    async def main() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__.split(".")[0])

    monkeypatch.setattr(sys, "argv", ["run_x.py", "--dsn", "x", "--loop", loop])
    run_on_loop(main)
    assert seen == [loop]


def test_peers_run_on_their_own_command_lines_loops() -> None:
    assert PEERS["pgqueuer-asyncpg"].loop == "uvloop"  # `pgq run`
    assert PEERS["pgqueuer-psycopg"].loop == "uvloop"
    assert PEERS["oban"].loop == "uvloop"  # `oban start`
    assert PEERS["procrastinate"].loop == "asyncio"  # `procrastinate worker`
    assert PEERS[FLOOR].loop is None  # the floor shares pgwork's
