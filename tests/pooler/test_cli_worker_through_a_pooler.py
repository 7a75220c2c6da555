"""``pgwork worker --dsn POOLER --no-prepare --notify-dsn DIRECT`` in a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

TARGET = """
from pydantic import BaseModel
from pgwork import (
    JobTypeRegistry, PostgresNotifyAdapter, PostgresStateAdapter, create_client,
    create_in_process_worker,
)

class Num(BaseModel):
    n: int

registry = JobTypeRegistry()
quick = registry.job_type("quick", input=Num)

async def handle_quick(attempt):
    return None

async def worker(dsn, notify_dsn=None, prepare_threshold=5, max_slots=10):
    state = await PostgresStateAdapter.connect(dsn, prepare_threshold=prepare_threshold)
    client = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(notify_dsn or dsn),
        registry=registry,
    )
    return create_in_process_worker(
        client=client, processors={quick: handle_quick}, max_slots=max_slots, poll_interval=30
    )
"""

ENQUEUE = """
import anyio, psycopg, sys
sys.path.insert(0, ".")
from deploy_target import registry, quick, Num
from pgwork import PostgresNotifyAdapter, PostgresStateAdapter, create_client

async def main(dsn, count):
    state = await PostgresStateAdapter.connect(dsn, prepare_threshold=None)
    # Publishing goes through the pooler: pg_notify runs in the enqueuing transaction.
    notify = PostgresNotifyAdapter(dsn)
    client = create_client(state_adapter=state, notify_adapter=notify, registry=registry)
    async with await psycopg.AsyncConnection.connect(dsn, prepare_threshold=None) as conn:
        for n in range(count):
            await client.start_chain(conn, quick, Num(n=n))
            await conn.commit()
    await client.close()

anyio.run(main, sys.argv[1], int(sys.argv[2]))
"""


def _completed(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pgwork.jobs WHERE status = 'completed'").fetchone()
    assert row is not None
    return int(row[0])


def test_the_cli_worker_runs_through_a_transaction_pooler_with_a_direct_notify_dsn(
    tmp_path: Path, pgwork_dsn: str, pooled_dsn: str
) -> None:
    (tmp_path / "deploy_target.py").write_text(TARGET)
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "PYTHONUNBUFFERED": "1",
    }
    stderr_path = tmp_path / "worker.stderr"
    args = ["--dsn", pooled_dsn, "--no-prepare", "--notify-dsn", pgwork_dsn]
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgwork.cli", "worker", "deploy_target:worker", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 30
            while "worker.started" not in stderr_path.read_text():
                assert proc.poll() is None, stderr_path.read_text()
                assert time.monotonic() < deadline, stderr_path.read_text()
                time.sleep(0.05)
            subprocess.run(
                [sys.executable, "-c", ENQUEUE, pooled_dsn, "50"],
                cwd=tmp_path,
                env=env,
                check=True,
            )
            # The worker polls every 30 s: only notifications bring these in time.
            deadline = time.monotonic() + 20
            while _completed(pgwork_dsn) < 50:
                assert time.monotonic() < deadline, stderr_path.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = stderr_path.read_text()
    assert " WARNING " not in log
    assert " ERROR " not in log
    assert _completed(pgwork_dsn) == 50


@pytest.fixture(autouse=True)
def _no_inherited_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGWORK_DSN", "DATABASE_URL", "PGWORK_NOTIFY_DSN"):
        monkeypatch.delenv(name, raising=False)
