"""``pgwork queues`` (counts, pause, resume) and ``pgwork workers`` on real PostgreSQL."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import anyio
import psycopg
from click.testing import CliRunner, Result
from pydantic import BaseModel
from tests.cli._cli_seed import seed
from tests.cli._run import run

from pgwork import JobTypeRegistry, PostgresStateAdapter, create_client
from pgwork.adapters.state import WorkerInfo
from pgwork.cli import main


def run_json(runner: CliRunner, dsn: str, *args: str) -> Any:
    result = run(runner, dsn, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def queues_by_name(runner: CliRunner, dsn: str) -> dict[str, dict[str, Any]]:
    return {q["queue"]: q for q in run_json(runner, dsn, "queues")["queues"]}


def rows(result: Result) -> dict[str, list[str]]:
    """Table rows by their first cell."""
    return {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}


# --- queues ----------------------------------------------------------------------------


def test_queues_counts_unfinished_work_per_queue(runner: CliRunner, pgwork_dsn: str) -> None:
    seed(pgwork_dsn)

    result = run(runner, pgwork_dsn, "queues")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].split() == [
        "QUEUE",
        "DEPTH",
        "READY",
        "SCHEDULED",
        "LEASED",
        "BLOCKED",
        "FAILED",
        "OLDEST",
        "READY",
        "PAUSED",
    ]
    table = rows(result)
    assert table["default"] == ["default", "0", "0", "0", "0", "0", "1", "-", "no"]
    assert table["mail"][:7] == ["mail", "4", "3", "1", "0", "1", "0"]
    assert table["mail"][-1] == "no"


def test_queues_json_has_stable_keys(runner: CliRunner, pgwork_dsn: str) -> None:
    seed(pgwork_dsn)

    queues = queues_by_name(runner, pgwork_dsn)

    mail = queues["mail"]
    assert set(mail) == {
        "queue",
        "paused",
        "depth",
        "ready",
        "scheduled",
        "leased",
        "blocked",
        "failed",
        "oldest_ready_at",
        "oldest_ready_age_seconds",
    }
    assert (mail["depth"], mail["ready"], mail["scheduled"], mail["blocked"]) == (4, 3, 1, 1)
    assert datetime.fromisoformat(mail["oldest_ready_at"]).tzinfo is not None
    assert mail["oldest_ready_age_seconds"] >= 0
    assert queues["default"]["oldest_ready_at"] is None
    assert queues["default"]["failed"] == 1


def test_queues_pause_and_resume(runner: CliRunner, pgwork_dsn: str) -> None:
    paused = run(runner, pgwork_dsn, "queues", "pause", "reports")
    listed = queues_by_name(runner, pgwork_dsn)
    table = rows(run(runner, pgwork_dsn, "queues"))
    resumed = run(runner, pgwork_dsn, "queues", "resume", "reports")

    assert paused.exit_code == 0, paused.output
    assert "paused queue 'reports'" in paused.stdout
    assert listed["reports"]["paused"] is True
    assert table["reports"][-1] == "yes"
    assert resumed.exit_code == 0, resumed.output
    assert "resumed queue 'reports'" in resumed.stdout
    assert queues_by_name(runner, pgwork_dsn)["reports"]["paused"] is False


def test_queues_options_may_come_before_the_subcommand(
    runner: CliRunner, pgwork_dsn: str, pgwork_schema: str
) -> None:
    result = runner.invoke(
        main, ["queues", "--dsn", pgwork_dsn, "--schema", pgwork_schema, "pause", "mail"]
    )

    assert result.exit_code == 0, result.output
    assert queues_by_name(runner, pgwork_dsn)["mail"]["paused"] is True


def test_queues_on_a_fresh_database_says_there_are_none(runner: CliRunner, pgwork_dsn: str) -> None:
    result = run(runner, pgwork_dsn, "queues")

    assert result.exit_code == 0
    assert "every queue is empty" in result.stdout
    assert run_json(runner, pgwork_dsn, "queues") == {"queues": [], "unhandled": []}


# --- workers ---------------------------------------------------------------------------


async def _register(dsn: str, *workers: WorkerInfo) -> None:
    state = await PostgresStateAdapter.connect(dsn)
    try:
        for worker in workers:
            await state.register_worker(worker=worker)
    finally:
        await state.close()


def test_workers_lists_registered_workers(runner: CliRunner, pgwork_dsn: str) -> None:
    anyio.run(
        _register,
        pgwork_dsn,
        WorkerInfo(
            id="web-1", host="web", pid=101, queues=("high", "default"), job_types=(), max_slots=4
        ),
    )

    result = run(runner, pgwork_dsn, "workers")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].split() == [
        "ID",
        "HOST",
        "PID",
        "STATUS",
        "SLOTS",
        "HUNG",
        "QUEUES",
        "HEARTBEAT",
        "ALIVE",
    ]
    row = rows(result)["web-1"]
    assert row[:7] == ["web-1", "web", "101", "idle", "0/4", "0", "high,default"]
    assert row[-2:] == ["ago", "yes"]


def test_workers_json_and_dead_after(runner: CliRunner, pgwork_dsn: str) -> None:
    info = WorkerInfo(
        id="w-2",
        host="box",
        pid=7,
        queues=("default",),
        job_types=("send_mail",),
        max_slots=2,
        metadata={"version": "1.2"},
    )
    anyio.run(_register, pgwork_dsn, info)

    (alive,) = run_json(runner, pgwork_dsn, "workers")["workers"]
    (dead,) = run_json(runner, pgwork_dsn, "workers", "--dead-after", "0.000001")["workers"]

    assert set(alive) == {
        "id",
        "host",
        "pid",
        "status",
        "alive",
        "active_slots",
        "max_slots",
        "abandoned_handlers",
        "queues",
        "job_types",
        "started_at",
        "heartbeat_at",
        "heartbeat_age_seconds",
        "metadata",
    }
    assert (alive["id"], alive["pid"], alive["queues"], alive["job_types"]) == (
        "w-2",
        7,
        ["default"],
        ["send_mail"],
    )
    assert alive["metadata"] == {"version": "1.2"}
    assert alive["alive"] is True
    assert dead["alive"] is False
    assert datetime.fromisoformat(alive["heartbeat_at"]).tzinfo is not None
    assert alive["heartbeat_age_seconds"] >= 0


def test_workers_after_a_worker_stopped(runner: CliRunner, pgwork_dsn: str) -> None:
    seed(pgwork_dsn)  # its worker ran, then stopped

    (worker,) = run_json(runner, pgwork_dsn, "workers")["workers"]

    assert (worker["status"], worker["alive"]) == ("stopped", False)
    assert set(worker["job_types"]) == {"fetch", "parse", "explode"}


def test_workers_with_none_registered(runner: CliRunner, pgwork_dsn: str) -> None:
    result = run(runner, pgwork_dsn, "workers")

    assert result.exit_code == 0
    assert "no workers registered" in result.stdout
    assert run_json(runner, pgwork_dsn, "workers") == {"workers": []}


def test_workers_refuses_a_dead_after_that_is_not_positive(
    runner: CliRunner, pgwork_dsn: str
) -> None:
    result = run(runner, pgwork_dsn, "workers", "--dead-after", "0")

    assert result.exit_code == 2
    assert "--dead-after" in result.stderr


class Num(BaseModel):
    n: int


def test_queues_tells_prefetched_jobs_from_running_ones(runner: CliRunner, pgwork_dsn: str) -> None:
    """Three jobs leased by a worker whose heartbeat says one handler runs: two of them
    were prefetched and wait for a slot, and the table must not call them running."""

    async def lease_three() -> None:
        reg = JobTypeRegistry()
        step = reg.job_type("step", input=Num)
        state = await PostgresStateAdapter.connect(pgwork_dsn)
        client = create_client(state_adapter=state, registry=reg, observers=[])
        try:
            async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
                for n in range(3):
                    await client.start_chain(conn, step, Num(n=n))
                await conn.commit()
            await state.register_worker(
                worker=WorkerInfo(
                    id="w", host="h", pid=1, queues=("default",), job_types=("step",), max_slots=1
                )
            )
            leased = await state.acquire(
                worker_id="w", leases={"step": timedelta(minutes=5)}, queues=None, limit=3
            )
            assert len(leased) == 3
            assert await state.heartbeat(worker_id="w", active_slots=1, status="busy")
        finally:
            await client.close()

    anyio.run(lease_three)
    result = run(runner, pgwork_dsn, "queues")

    assert result.exit_code == 0, result.output
    assert rows(result)["default"][4] == "3"
    assert "leased 3: 1 running in handlers, 2 reserved" in " ".join(result.stdout.split())
    assert "RUNNING" not in result.stdout
