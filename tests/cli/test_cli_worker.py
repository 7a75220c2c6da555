"""``pgwork worker``: loading MODULE:ATTR, one-line errors, and signals in a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result

from pgwork.cli import EXIT_ABANDONED, EXIT_ERROR, main

ROOT = Path(__file__).resolve().parents[2]
REFUSED = "postgresql://pgwork:hunter2-secret@127.0.0.1:1/pgwork"

# A module `pgwork worker` can load: a job that blocks until aborted, a factory taking
# every option, a prebuilt worker, and attributes of the wrong kind.
TARGETS = """
import anyio
from pydantic import BaseModel
from pgwork import (
    InProcessNotifyAdapter, JobTypeRegistry, PostgresNotifyAdapter, PostgresStateAdapter,
    create_client, create_in_process_worker,
)

class Num(BaseModel):
    n: int

registry = JobTypeRegistry()
block = registry.job_type("block", input=Num)
quick = registry.job_type("quick", input=Num)
stubborn = registry.job_type("stubborn", input=Num)
loop_of = registry.job_type("loop_of", input=Num, output=str)

async def handle_block(attempt):
    await anyio.sleep_forever()

async def handle_stubborn(attempt):
    # Ignores cancellation for good: only the process ending stops it.
    while True:
        try:
            await anyio.sleep(3600)
        except BaseException:
            pass

async def handle_quick(attempt):
    return None

async def handle_loop_of(attempt):
    import asyncio
    return type(asyncio.get_running_loop()).__module__

async def worker(dsn, max_slots=2, queues=None, poll_interval=0.2, abandon_after=5.0):
    state = await PostgresStateAdapter.connect(dsn)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=registry
    )
    return create_in_process_worker(
        client=client,
        processors={
            block: handle_block, quick: handle_quick, stubborn: handle_stubborn,
            loop_of: handle_loop_of,
        },
        max_slots=max_slots,
        queues=queues,
        poll_interval=poll_interval,
        grace_period=60,
        abandon_after=abandon_after,
    )

async def impatient(dsn, max_slots=2):
    built = await worker(dsn, max_slots=max_slots, abandon_after=0.5)
    built.grace_period = 0.5
    return built

def only_dsn(dsn):
    raise AssertionError("not reached in these tests")

class _State:
    async def close(self):
        pass

prebuilt = create_in_process_worker(
    client=create_client(state_adapter=_State(), registry=registry),
    processors={quick: handle_quick},
)
not_a_worker = 42

def returns_a_string(dsn):
    return "nope"

def no_dsn(max_slots=2):
    from pgwork.errors import ConfigurationError
    raise ConfigurationError("no_dsn was called")

def wrong_signature(dsn, settings):
    raise AssertionError("not reached: no option fills settings")

def shows_pooler_options(dsn, notify_dsn=None, prepare_threshold=5):
    from pgwork.errors import ConfigurationError
    raise ConfigurationError(f"notify_dsn={notify_dsn} prepare_threshold={prepare_threshold}")
"""


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "cli_targets.py").write_text(TARGETS)
    monkeypatch.chdir(tmp_path)
    for name in ("PGWORK_DSN", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path
    sys.modules.pop("cli_targets", None)


def _one_line_error(result: Result) -> str:
    assert result.exit_code == EXIT_ERROR, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("cli_targets", "is not MODULE:ATTR"),
        ("cli_targets:", "is not MODULE:ATTR"),
        ("no_such_module:worker", "cannot import 'no_such_module'"),
        ("cli_targets:missing", "has no attribute 'missing'"),
        ("cli_targets:not_a_worker", "is a int, not an InProcessWorker"),
        ("cli_targets:returns_a_string", "returned a str, not an InProcessWorker"),
    ],
)
def test_a_bad_target_is_one_line(targets: Path, target: str, message: str) -> None:
    result = CliRunner().invoke(main, ["worker", target, "--dsn", REFUSED])

    assert message in _one_line_error(result)


def test_options_a_prebuilt_worker_cannot_take_are_refused(targets: Path) -> None:
    result = CliRunner().invoke(main, ["worker", "cli_targets:prebuilt", "--slots", "3"])

    assert "built in advance" in _one_line_error(result)


def test_an_option_the_factory_does_not_take_is_refused(targets: Path) -> None:
    result = CliRunner().invoke(
        main, ["worker", "cli_targets:only_dsn", "--dsn", REFUSED, "--queues", "high"]
    )

    assert "--queues was given but cli_targets:only_dsn takes no queues=" in _one_line_error(result)


def test_notify_dsn_and_no_prepare_reach_the_factory_by_name(targets: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "worker",
            "cli_targets:shows_pooler_options",
            "--dsn",
            "postgresql://pooler:6432/app",
            "--notify-dsn",
            "postgresql://direct:5432/app",
            "--no-prepare",
        ],
    )

    line = _one_line_error(result)
    assert "notify_dsn=postgresql://direct:5432/app prepare_threshold=None" in line


def test_without_the_pooler_options_the_factory_keeps_its_defaults(targets: Path) -> None:
    result = CliRunner().invoke(
        main, ["worker", "cli_targets:shows_pooler_options", "--dsn", REFUSED]
    )

    assert "notify_dsn=None prepare_threshold=5" in _one_line_error(result)


def test_no_prepare_for_a_factory_without_prepare_threshold_is_refused(targets: Path) -> None:
    result = CliRunner().invoke(
        main, ["worker", "cli_targets:only_dsn", "--dsn", REFUSED, "--no-prepare"]
    )

    assert "--no-prepare was given but cli_targets:only_dsn takes no prepare_threshold=" in (
        _one_line_error(result)
    )


def test_a_factory_needing_a_dsn_without_one_is_a_usage_error(targets: Path) -> None:
    result = CliRunner().invoke(main, ["worker", "cli_targets:worker"])

    assert result.exit_code == 2
    assert "needs a database" in result.stderr


def test_an_unreachable_database_is_one_line_without_the_password(targets: Path) -> None:
    result = CliRunner().invoke(main, ["worker", "cli_targets:worker", "--dsn", REFUSED])

    line = _one_line_error(result)
    assert "cannot connect to PostgreSQL" in line
    assert "hunter2-secret" not in result.output


def test_a_stray_argument_is_a_usage_error(targets: Path) -> None:
    result = CliRunner().invoke(main, ["worker", "cli_targets:worker", "extra"])

    assert result.exit_code == 2
    assert "unexpected argument 'extra'" in result.stderr


# --- the real program in a process of its own ----------------------------------------

BROKEN_MODULES = {
    "imports_missing.py": "import anyio\nimport no_such_dependency_of_the_app\n",
    "raises_on_import.py": "SETTINGS = {}\nPORT = SETTINGS['port']\n",
    "bad_syntax.py": "def worker(dsn):\n    return (\n",
}


def _run_program(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``pgwork`` as a user does; the one line it printed on stderr (exit status 2)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PGWORK_DSN", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "pgwork.cli", *args],
        cwd=cwd,
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_ERROR, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_dsn_on_the_command_line_for_a_factory_without_dsn_is_refused(targets: Path) -> None:
    line = _run_program(targets, "worker", "cli_targets:no_dsn", "--dsn", REFUSED)

    assert "--dsn was given but cli_targets:no_dsn takes no dsn= parameter" in line
    assert "hunter2-secret" not in line


def test_dsn_from_the_environment_is_not_forced_on_a_factory_without_dsn(targets: Path) -> None:
    line = _run_program(targets, "worker", "cli_targets:no_dsn", env={"DATABASE_URL": REFUSED})

    assert "no_dsn was called" in line


def test_dsn_on_the_command_line_for_a_prebuilt_worker_is_refused(targets: Path) -> None:
    line = _run_program(targets, "worker", "cli_targets:prebuilt", "--dsn", REFUSED)

    assert "built in advance, so --dsn" in line


def test_a_factory_with_a_parameter_no_option_fills_is_one_line(targets: Path) -> None:
    line = _run_program(targets, "worker", "cli_targets:wrong_signature", "--dsn", REFUSED)

    assert "cli_targets:wrong_signature cannot be called with the options given" in line
    assert "settings" in line


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("imports_missing", "ModuleNotFoundError: No module named 'no_such_dependency_of_the_app'"),
        ("raises_on_import", "KeyError: 'port'"),
        ("bad_syntax", "SyntaxError:"),
    ],
)
def test_a_module_that_fails_to_import_is_one_line_saying_where(
    targets: Path, module: str, message: str
) -> None:
    (targets / f"{module}.py").write_text(BROKEN_MODULES[f"{module}.py"])

    line = _run_program(targets, "worker", f"{module}:worker", "--dsn", REFUSED)

    assert f"importing '{module}' for '{module}:worker' failed" in line
    assert message in line
    assert f"{module}.py, line" in line


# --- a real process and real signals -------------------------------------------------


class WorkerProcess:
    def __init__(self, cwd: Path, dsn: str, *args: str) -> None:
        env = {**os.environ, "PGWORK_DSN": dsn, "PYTHONUNBUFFERED": "1"}
        self.stderr_path = cwd / "worker.stderr"
        self._stderr = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgwork.cli", "worker", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )

    def wait_for_output(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stderr_path.read_text():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.stderr_path.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in:\n{self.stderr_path.read_text()}")
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        code = self.proc.wait(timeout)
        self._stderr.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


def _enqueue(dsn: str, type_name: str) -> str:
    """Insert a job the way the client does, from a plain subprocess-free script."""
    code = textwrap.dedent(
        f"""
        import anyio, psycopg, sys
        sys.path.insert(0, ".")
        from cli_targets import registry, Num
        from pgwork import PostgresStateAdapter, create_client

        async def main():
            client = create_client(
                state_adapter=await PostgresStateAdapter.connect({dsn!r}), registry=registry
            )
            async with await psycopg.AsyncConnection.connect({dsn!r}) as conn:
                started = await client.start_chain(conn, {type_name!r}, Num(n=1))
                await conn.commit()
            await client.close()
            print(started.job_id)

        anyio.run(main)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _output(dsn: str, job_id: str) -> object:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT output FROM pgwork.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return row[0]


def _job(dsn: str, job_id: str) -> tuple[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status::text, attempt FROM pgwork.jobs WHERE id = %s", [job_id]
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _wait_for_status(dsn: str, job_id: str, status: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _job(dsn, job_id)[0] != status:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} never became {status}")
        time.sleep(0.05)


def _one_job_then_sigterm(
    cwd: Path, dsn: str, type_name: str, *args: str
) -> tuple[WorkerProcess, str]:
    """Start ``pgwork worker cli_targets:worker ARGS``, have it complete one job of
    ``type_name``, stop it with SIGTERM and check it exits 0; the process and job id."""
    worker = WorkerProcess(cwd, dsn, "cli_targets:worker", *args)
    try:
        worker.wait_for_output("worker.started")
        job_id = _enqueue(dsn, type_name)
        _wait_for_status(dsn, job_id, "completed")
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        worker.kill()
    return worker, job_id


def test_sigterm_stops_the_worker_gracefully_with_exit_zero(targets: Path, pgwork_dsn: str) -> None:
    worker, _ = _one_job_then_sigterm(targets, pgwork_dsn, "quick", "--slots", "3")
    log = worker.stderr_path.read_text()
    assert "max_slots=3" in log
    assert "SIGTERM: stopping" in log
    assert "worker.stopped" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("args", "loop"),
    [
        ((), "uvloop"),  # auto: uvloop is installed here (scripts/dev.py)
        (("--loop", "uvloop"), "uvloop"),
        (("--loop", "asyncio"), "asyncio"),
    ],
)
def test_the_worker_runs_its_handlers_on_the_event_loop_chosen(
    targets: Path, pgwork_dsn: str, args: tuple[str, ...], loop: str
) -> None:
    _, job_id = _one_job_then_sigterm(targets, pgwork_dsn, "loop_of", *args)
    assert str(_output(pgwork_dsn, job_id)).split(".")[0] == loop


def test_asking_for_uvloop_where_it_is_missing_is_a_usage_error(
    targets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    result = CliRunner().invoke(
        main, ["worker", "cli_targets:worker", "--dsn", REFUSED, "--loop", "uvloop"]
    )
    assert result.exit_code == 2
    assert "pgwork[uvloop]" in result.stderr


def test_a_second_signal_aborts_in_flight_jobs_and_hands_them_back(
    targets: Path, pgwork_dsn: str
) -> None:
    worker = WorkerProcess(
        targets, pgwork_dsn, "cli_targets:worker", "--queues", "low", "default", "high"
    )
    try:
        worker.wait_for_output("worker.started")
        job_id = _enqueue(pgwork_dsn, "block")
        _wait_for_status(pgwork_dsn, job_id, "running")
        worker.signal(signal.SIGINT)
        worker.wait_for_output("SIGINT: stopping")
        assert _job(pgwork_dsn, job_id)[0] == "running"  # the grace period is 60 s
        worker.signal(signal.SIGINT)
        assert worker.wait() == 0
    finally:
        worker.kill()

    assert _job(pgwork_dsn, job_id) == ("pending", 0)
    log = worker.stderr_path.read_text()
    assert "queues=low,default,high" in log
    assert "aborting in-flight jobs" in log
    assert "reason=worker_stopping released=True" in log


def test_a_handler_that_ignores_cancellation_does_not_keep_the_process_alive(
    targets: Path, pgwork_dsn: str
) -> None:
    worker = WorkerProcess(targets, pgwork_dsn, "cli_targets:impatient")
    try:
        worker.wait_for_output("worker.started")
        job_id = _enqueue(pgwork_dsn, "stubborn")
        _wait_for_status(pgwork_dsn, job_id, "running")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == EXIT_ABANDONED
    finally:
        worker.kill()

    # Given back to the queue with the abandoned attempt counted against it.
    assert _job(pgwork_dsn, job_id) == ("pending", 1)
    log = worker.stderr_path.read_text()
    assert "abandoned handler(s) still running" in log
