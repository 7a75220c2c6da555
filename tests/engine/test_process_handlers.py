"""CPU-bound job types: a plain ``def handler(input) -> output`` runs in the worker's
own processes (``process_handlers=``).

What the user sees: the output comes back, computed in another process that serves
the next jobs too; the input and output cross as the JSON the database stores (what the
codec refuses fails the attempt, named); a process that dies fails its attempt only,
and the next one runs in a new process; a timeout kills the process and fails the
attempt with ``TimeoutError``; a handler that cannot be sent to a process is refused
when the worker is built. Each mechanism has a control that takes it out.

The handlers are defined at the top level of this module: a process imports them from
here by name.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    ConfigurationError,
    HandlerProcessDiedError,
    JobStatus,
    JobTypeRegistry,
    PayloadValidationError,
    ProcessHandlerError,
    RetryPolicy,
    create_in_process_worker,
)
from pgwork.worker._processes import HandlerProcesses, _Child

from ._run_one import RunOne
from ._slow_start import double
from .conftest import ClientFactory, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

NO_BACKOFF = RetryPolicy(initial=timedelta(0), maximum=timedelta(0))


class Upto(BaseModel):
    n: int


class Primes(BaseModel):
    count: int
    pid: int


class Task(BaseModel):
    """What a test handler should do: ``marker`` is a file it writes its pid to."""

    marker: str
    crash: str = ""  # "exit" or "kill": end its own process on its first attempt
    seconds: float = 0.0


class Done(BaseModel):
    pid: int


def count_primes(upto: Upto) -> Primes:
    """CPU-bound: holds the GIL for as long as it runs."""
    count = sum(1 for k in range(2, upto.n) if all(k % d for d in range(2, math.isqrt(k) + 1)))
    return Primes(count=count, pid=os.getpid())


def crash_once(task: Task) -> Done:
    marker = Path(task.marker)
    first = not marker.exists()
    with marker.open("a") as pids:
        pids.write(f"{os.getpid()}\n")
    if first and task.crash == "exit":
        os._exit(3)
    if first and task.crash == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(task.seconds)
    return Done(pid=os.getpid())


def spin(task: Task) -> Done:
    Path(task.marker).write_text(str(os.getpid()))
    while True:
        pass


def returns_a_bad_output(upto: Upto) -> Any:
    return {"count": "many", "pid": os.getpid()}


class NeedsTwoArguments(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


def raises(upto: Upto) -> Primes:
    if upto.n == 1:
        raise ValueError("n must be more than 1")
    raise NeedsTwoArguments(418, "a teapot")


def _type_of(error: type[BaseException]) -> str:
    return f"{error.__module__}.{error.__qualname__}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(marker: Path) -> list[int]:
    return [int(line) for line in marker.read_text().split()] if marker.exists() else []


async def _status(client: Any, job_id: Any, status: JobStatus) -> None:
    async def reached() -> bool:
        return (await client.get_job(job_id)).status is status

    await eventually(reached, what=f"the job {status.value}", timeout=30)


# --- running -------------------------------------------------------------------------


async def test_a_cpu_bound_handler_runs_in_the_workers_own_process_and_returns_its_output(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    primes = reg.job_type("primes", input=Upto, output=Primes)
    client = await make_client(reg)
    worker = await workers(
        client=client, process_handlers={primes: count_primes}, max_slots=1, processes=1
    )
    first = await client.start_chain(conn, primes, Upto(n=20_000))
    second = await client.start_chain(conn, primes, Upto(n=100))
    await conn.commit()
    await _status(client, second.job_id, JobStatus.COMPLETED)

    one = (await client.get_chain(first.id)).output
    two = (await client.get_chain(second.id)).output
    assert (one.count, two.count) == (2262, 25)
    assert one.pid != os.getpid()  # another process
    assert two.pid == one.pid  # which served the next job too: one process per slot
    assert _alive(one.pid)
    await worker.stop()
    assert not _alive(one.pid)  # the worker's processes end with it


# --- what crosses --------------------------------------------------------------------


async def test_an_output_the_codec_refuses_fails_the_attempt_in_the_process(
    run_one: RunOne,
) -> None:
    reg = JobTypeRegistry()
    bad = reg.job_type("bad", input=Upto, output=Primes, max_attempts=1)
    ran = await run_one(
        reg, Upto(n=1), until=JobStatus.FAILED, process_handlers={bad: returns_a_bad_output}
    )

    error = (await ran.job()).last_attempt_error
    assert error is not None
    assert error.type == _type_of(PayloadValidationError)
    assert "output of job type 'bad' does not match its model: $.count" in error.message
    # Refused in the handler's process, before it crossed: its traceback is there.
    assert "raised in the handler's process" in error.traceback
    assert "_child.py" in error.traceback


async def test_what_a_handler_raises_comes_back_as_it_was_raised(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    raising = reg.job_type("raising", input=Upto, output=Primes, max_attempts=1)
    client = await make_client(reg)
    await workers(client=client, process_handlers={raising: raises})
    plain = await client.start_chain(conn, raising, Upto(n=1))
    odd = await client.start_chain(conn, raising, Upto(n=2))
    await conn.commit()
    await _status(client, plain.job_id, JobStatus.FAILED)
    await _status(client, odd.job_id, JobStatus.FAILED)

    error = (await client.get_job(plain.job_id)).last_attempt_error
    assert error is not None
    assert (error.type, error.message) == ("builtins.ValueError", "n must be more than 1")
    assert 'raise ValueError("n must be more than 1")' in error.traceback
    # An exception that cannot be rebuilt by pickle: named, with what to do.
    error = (await client.get_job(odd.job_id)).last_attempt_error
    assert error is not None
    assert error.type == _type_of(ProcessHandlerError)
    assert "NeedsTwoArguments: 418: a teapot" in error.message
    assert "cannot be sent back from its process" in error.message


def test_pgwork_errors_cross_a_process_boundary_whole() -> None:
    # The mechanism behind the codec's refusal keeping its type: without
    # ``PgworkError.__reduce__`` this unpickles as a TypeError (its __init__ takes
    # three arguments, not the message).
    import pickle

    error = PayloadValidationError("bad", "output", "$.count: not an int")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is PayloadValidationError
    assert str(again) == str(error)
    assert again.type_name == "bad"


# --- a process that dies -------------------------------------------------------------


@pytest.mark.parametrize(("crash", "how"), [("exit", "exited with code 3"), ("kill", "SIGKILL")])
async def test_a_process_that_dies_fails_its_attempt_only_and_is_replaced(
    crash: str,
    how: str,
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    tmp_path: Path,
) -> None:
    reg = JobTypeRegistry()
    crashing = reg.job_type("crashing", input=Task, output=Done, retry=NO_BACKOFF)
    steady = reg.job_type("steady", input=Task, output=Done)
    client = await make_client(reg)
    await workers(
        client=client,
        process_handlers={crashing: crash_once, steady: crash_once},
        max_slots=2,
        processes=2,
    )
    # A long job runs in one process while the other one dies.
    calm = await client.start_chain(
        conn, steady, Task(marker=str(tmp_path / "steady"), seconds=2.0)
    )
    await conn.commit()
    await eventually(_exists(tmp_path / "steady"), what="the steady job running")
    started = await client.start_chain(
        conn, crashing, Task(marker=str(tmp_path / "c"), crash=crash)
    )
    await conn.commit()
    await _status(client, started.job_id, JobStatus.COMPLETED)
    await _status(client, calm.job_id, JobStatus.COMPLETED)

    job = await client.get_job(started.job_id)
    assert job.attempt == 2  # retried, as the type's policy says
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == _type_of(HandlerProcessDiedError)
    assert how in job.last_attempt_error.message
    died, ran = _pids(tmp_path / "c")
    assert ran != died  # a new process ran the retry
    assert not _alive(died)
    assert job.output == Done(pid=ran)
    # The other attempt was not touched: done at its first attempt in its process.
    other = await client.get_job(calm.job_id)
    assert other.attempt == 1
    assert other.output == Done(pid=_pids(tmp_path / "steady")[0])


async def test_control_without_replacing_a_dead_process_the_next_attempt_never_runs(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(HandlerProcesses, "_discard", lambda self, child: None)
    reg = JobTypeRegistry()
    crashing = reg.job_type("crashing", input=Task, output=Done, retry=NO_BACKOFF)
    client = await make_client(reg)
    await workers(
        client=client, process_handlers={crashing: crash_once}, processes=1, grace_period=0
    )
    started = await client.start_chain(
        conn, crashing, Task(marker=str(tmp_path / "c"), crash="exit")
    )
    await conn.commit()

    async def failed_once() -> bool:
        return (await client.get_job(started.job_id)).last_attempt_error is not None

    await eventually(failed_once, what="the first attempt failed", timeout=30)
    await anyio.sleep(2.0)
    assert len(_pids(tmp_path / "c")) == 1  # the retry waits for a process forever
    assert (await client.get_job(started.job_id)).status is JobStatus.RUNNING


# --- timeouts ------------------------------------------------------------------------


async def test_a_timeout_kills_the_process_and_fails_the_attempt_with_timeout_error(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], tmp_path: Path
) -> None:
    pid = await _time_out_a_spinning_handler(make_client, workers, conn, tmp_path)
    assert not _alive(pid)


async def test_control_without_the_kill_the_timed_out_process_runs_on(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_Child, "kill", lambda self: None)
    # Without the kill the worker would wait for the spinning process for ever: the
    # test's own stop (the stop's abort) ends its wait.
    monkeypatch.setattr(HandlerProcesses, "_ended", _returns_at_once)
    pid = await _time_out_a_spinning_handler(make_client, workers, conn, tmp_path)
    assert _alive(pid)
    os.kill(pid, signal.SIGKILL)


async def _returns_at_once(self: HandlerProcesses, child: _Child) -> None:
    return None


async def _starts_nothing(self: HandlerProcesses) -> None:
    return None


async def _time_out_a_spinning_handler(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], tmp_path: Path
) -> int:
    """A handler that never returns, its type's timeout 1 s: the attempt fails with
    TimeoutError; the spinning process's pid, the one process's that ran a job before
    it."""
    reg = JobTypeRegistry()
    primes = reg.job_type("primes", input=Upto, output=Primes)
    forever = reg.job_type(
        "forever", input=Task, output=Done, timeout=timedelta(seconds=1), max_attempts=1
    )
    client = await make_client(reg)
    await workers(
        client=client, process_handlers={primes: count_primes, forever: spin}, processes=1
    )
    warm = await client.start_chain(conn, primes, Upto(n=10))
    await conn.commit()
    await _status(client, warm.job_id, JobStatus.COMPLETED)
    marker = tmp_path / "pid"
    started = await client.start_chain(conn, forever, Task(marker=str(marker)))
    await conn.commit()
    await _status(client, started.job_id, JobStatus.FAILED)

    job = await client.get_job(started.job_id)
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.TimeoutError"
    pid = int(marker.read_text())
    assert pid == (await client.get_chain(warm.id)).output.pid
    return pid


# --- processes started before they are needed ----------------------------------------

# How long a handler process takes to import ``_slow_start``: longer than the timeouts
# below, so an attempt that waited for a process's start could not end in time.
# Long enough that a call to a ready process, even on a loaded machine, ends well
# within the quick type's timeout (half of it).
IMPORT_SECONDS = 4.0


def _slow_start(monkeypatch: pytest.MonkeyPatch, marks: Path, seconds: float) -> None:
    """Each handler process started from now on imports ``_slow_start`` in ``seconds``
    and then marks ``marks`` with its pid."""
    marks.mkdir(exist_ok=True)
    monkeypatch.setenv("PGWORK_TEST_IMPORT_SECONDS", str(seconds))
    monkeypatch.setenv("PGWORK_TEST_IMPORT_MARKS", str(marks))


def _marked(marks: Path) -> list[int]:
    return sorted(int(path.name) for path in marks.iterdir())


def _quick(reg: JobTypeRegistry) -> Any:
    """A type whose timeout is shorter than a process's start (``IMPORT_SECONDS``)."""
    return reg.job_type(
        "quick",
        input=int,
        output=int,
        timeout=timedelta(seconds=IMPORT_SECONDS / 2),
        max_attempts=1,
    )


async def _first_attempt_of_a_quick_job(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    marks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Any, list[int]]:
    """A worker of one process for a ``_quick`` type whose module imports slowly
    there: the job of its first attempt, ended, and the processes that had imported
    it when the worker's start returned. No process outlives the worker."""
    _slow_start(monkeypatch, marks, IMPORT_SECONDS)
    reg = JobTypeRegistry()
    quick = _quick(reg)
    client = await make_client(reg)
    worker = await workers(
        client=client, process_handlers={quick: double}, processes=1, worker_id="quick"
    )
    ready = _marked(marks)
    started = await client.start_chain(conn, quick, 21)
    await conn.commit()

    async def ended() -> bool:
        return (await client.get_job(started.job_id)).status in (
            JobStatus.COMPLETED,
            JobStatus.FAILED,
        )

    await eventually(ended, what="the job ended", timeout=30)
    job = await client.get_job(started.job_id)
    await worker.stop()
    assert _children("quick") == []
    assert [pid for pid in _marked(marks) if _alive(pid)] == []
    return job, ready


def _children(worker_id: str) -> list[int]:
    """The pids of the worker's handler processes that run now."""
    return sorted(
        child.pid
        for child in multiprocessing.active_children()
        if child.name.startswith(f"pgwork-process-{worker_id}-") and child.pid is not None
    )


async def test_a_process_handlers_first_attempt_does_not_pay_for_its_processs_start(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker starts its processes, and waits until each has imported the
    handlers, before it takes a job: an attempt whose timeout is shorter than a
    process's start completes at its first attempt."""
    job, ready = await _first_attempt_of_a_quick_job(
        make_client, workers, conn, tmp_path / "marks", monkeypatch
    )
    assert len(ready) == 1  # the process was ready before the worker took a job
    assert (job.status, job.attempt, job.output) == (JobStatus.COMPLETED, 1, 42)


async def test_control_a_process_started_by_the_first_attempt_times_it_out(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the start before the first job, the first attempt starts its process,
    and the start, longer than the type's timeout, fails it."""
    monkeypatch.setattr(HandlerProcesses, "start", _starts_nothing)
    job, ready = await _first_attempt_of_a_quick_job(
        make_client, workers, conn, tmp_path / "marks", monkeypatch
    )
    assert ready == []
    assert (job.status, job.attempt) == (JobStatus.FAILED, 1)
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.TimeoutError"


@pytest.mark.parametrize("how", ["died with its attempt", "killed while idle"])
async def test_a_process_that_ends_is_replaced_at_once(
    how: str,
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its successor starts as soon as it ended, not when the next call needs one: the
    next attempt, its timeout shorter than a start, completes."""
    marks = tmp_path / "marks"
    _slow_start(monkeypatch, marks, IMPORT_SECONDS)
    reg = JobTypeRegistry()
    quick = _quick(reg)
    crashing = reg.job_type("crashing", input=Task, output=Done, max_attempts=1)
    client = await make_client(reg)
    await workers(
        client=client, process_handlers={quick: double, crashing: crash_once}, processes=1
    )
    [first] = _marked(marks)  # started, and ready, with the worker
    if how == "killed while idle":
        os.kill(first, signal.SIGKILL)
    else:
        died = await client.start_chain(
            conn, crashing, Task(marker=str(tmp_path / "c"), crash="exit")
        )
        await conn.commit()
        await _status(client, died.job_id, JobStatus.FAILED)

    async def replaced() -> bool:
        return len(_marked(marks)) == 2

    await eventually(replaced, what="a new process started without a call", timeout=30)
    assert not _alive(first)
    started = await client.start_chain(conn, quick, 4)
    await conn.commit()
    await _status(client, started.job_id, JobStatus.COMPLETED)
    job = await client.get_job(started.job_id)
    assert (job.attempt, job.output) == (1, 8)


async def test_a_worker_stopped_while_its_processes_start_ends_them_and_takes_no_job(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop does not wait for a start that may take long: the processes still
    starting are ended with the worker, which took no job meanwhile."""
    # Longer than the test may run: only ending them ends them.
    _slow_start(monkeypatch, tmp_path / "marks", 600.0)
    reg = JobTypeRegistry()
    quick = _quick(reg)
    client = await make_client(reg)
    started = await client.start_chain(conn, quick, 1)
    await conn.commit()
    worker = create_in_process_worker(
        client=client,
        process_handlers={quick: double},
        processes=2,
        poll_interval=0.5,
        worker_id="starting",
    )

    async def both_started() -> bool:
        return len(_children("starting")) == 2

    async with anyio.create_task_group() as group:
        group.start_soon(worker.run)
        await eventually(both_started, what="the worker's processes starting", timeout=30)
        pids = _children("starting")
        # A stop that waited for the start would hang here: bounded, it fails.
        with anyio.fail_after(60):
            await worker.stop()
    assert [pid for pid in pids if _alive(pid)] == []
    assert _children("starting") == []
    assert _marked(tmp_path / "marks") == []  # none of them got ready
    job = await client.get_job(started.job_id)
    assert (job.status, job.attempt) == (JobStatus.PENDING, 0)


async def test_cancelling_the_job_or_stopping_the_worker_kills_the_attempts_process(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], tmp_path: Path
) -> None:
    reg = JobTypeRegistry()
    forever = reg.job_type("forever", input=Task, output=Done)
    client = await make_client(reg)
    worker = create_in_process_worker(
        client=client, process_handlers={forever: spin}, processes=2, poll_interval=0.5
    )
    await worker.start()
    cancelled = await client.start_chain(conn, forever, Task(marker=str(tmp_path / "a")))
    stopped = await client.start_chain(conn, forever, Task(marker=str(tmp_path / "b")))
    await conn.commit()
    await eventually(_exists(tmp_path / "a"), what="the first handler running", timeout=30)
    await eventually(_exists(tmp_path / "b"), what="the second handler running", timeout=30)
    first, second = (int((tmp_path / name).read_text()) for name in "ab")

    await client.cancel(conn, [cancelled.job_id])
    await conn.commit()
    await _status(client, cancelled.job_id, JobStatus.CANCELLED)
    await eventually(_gone(first), what="the cancelled job's process ended")
    assert _alive(second)  # the other attempt's process computes on

    await worker.stop(grace_period=0.5)
    assert not _alive(second)
    job = await client.get_job(stopped.job_id)
    assert job.status is JobStatus.PENDING  # handed back, no attempt burned
    assert job.attempt == 0


def _gone(pid: int) -> Any:
    async def check() -> bool:
        return not _alive(pid)

    return check


def _exists(path: Path) -> Any:
    async def check() -> bool:
        return path.exists()

    return check


# --- refused -------------------------------------------------------------------------


async def test_a_handler_that_cannot_be_sent_to_a_process_is_refused_when_built(
    make_client: ClientFactory,
) -> None:
    reg = JobTypeRegistry()
    primes = reg.job_type("primes", input=Upto, output=Primes)
    ledger = reg.job_type("ledger", input=Upto, mode="atomic")
    client = await make_client(reg)

    def nested(upto: Upto) -> Primes:
        return count_primes(upto)

    async def asynchronous(upto: Upto) -> Primes:
        return count_primes(upto)

    refused: dict[str, tuple[Any, Any]] = {
        "lambda": (primes, lambda upto: count_primes(upto)),
        "nested": (primes, nested),
        "async def": (primes, asynchronous),
        "not callable": (primes, 42),
        "atomic": (ledger, count_primes),
    }
    reasons = {
        "lambda": "cannot be pickled by reference",
        "nested": "cannot be pickled by reference",
        "async def": "is an async function",
        "not callable": "is not callable",
        "atomic": "is for an atomic job type",
    }
    for case, (job_type, handler) in refused.items():
        with pytest.raises(ProcessHandlerError, match=reasons[case]) as caught:
            create_in_process_worker(client=client, process_handlers={job_type: handler})
        assert isinstance(caught.value, ConfigurationError)
        assert caught.value.type_name == job_type.name

    # Control: the same function at the top level of a module is accepted.
    create_in_process_worker(client=client, process_handlers={primes: count_primes})


async def test_a_model_or_module_a_process_cannot_import_is_refused_when_built(
    make_client: ClientFactory,
) -> None:
    import sys
    import types

    class Local(BaseModel):
        n: int

    reg = JobTypeRegistry()
    local = reg.job_type("local", input=Local)
    primes = reg.job_type("primes", input=Upto, output=Primes)
    client = await make_client(reg)
    with pytest.raises(ProcessHandlerError, match="its input model"):
        create_in_process_worker(client=client, process_handlers={local: count_primes})

    # A module made in memory (as an exec'd notebook cell or docs block is) pickles by
    # name here but cannot be imported by a new process.
    module = types.ModuleType("made_in_memory")
    exec("def handler(upto):\n    return upto\n", module.__dict__)
    sys.modules["made_in_memory"] = module
    try:
        with pytest.raises(ProcessHandlerError, match="'made_in_memory', a module that was not"):
            create_in_process_worker(client=client, process_handlers={primes: module.handler})
    finally:
        del sys.modules["made_in_memory"]


async def test_a_type_with_two_handlers_and_a_bad_pool_size_are_refused(
    make_client: ClientFactory,
) -> None:
    reg = JobTypeRegistry()
    primes = reg.job_type("primes", input=Upto, output=Primes)
    client = await make_client(reg)

    async def on_the_loop(attempt: Any) -> None:
        return None

    with pytest.raises(ConfigurationError, match="in both processors and process_handlers"):
        create_in_process_worker(
            client=client, processors={primes: on_the_loop}, process_handlers={primes: count_primes}
        )
    for size in (0, 1.5, True):
        with pytest.raises(ConfigurationError, match="processes must be"):
            create_in_process_worker(
                client=client, process_handlers={primes: count_primes}, processes=size
            )
