"""One attempt at a task on the worker, as Django's task API shows it.

The handler of each task (``_worker.handler_for``) runs its attempts here:

* the attempt's ``TaskResult`` (status ``RUNNING``) is the job as acquired; on a retry
  the job is read again first, for the errors and workers of the attempts before
  (an acquired job comes without them);
* ``task_started`` is sent with it, then the task's function is called (with a
  ``TaskContext`` holding it, when the task takes one);
* its return value, normalised as Django does (``normalize_json``: a value JSON cannot
  hold is a ``TypeError``), completes the job (``attempt.complete``, so a value pgwork
  cannot store fails here too), then ``task_finished`` is sent (``SUCCESSFUL``);
* an exception fails the attempt, as pgwork fails any; on the job's last attempt
  ``task_finished`` is sent first (``FAILED``, the error appended). An attempt that
  will be retried has not finished the task: no signal. A ``SystemExit`` fails the
  attempt too, as Django's backends record it, where it would otherwise end the
  worker's event loop: it reaches pgwork as an ``Exception`` of the same name and
  traceback (``_as_exception``). A ``KeyboardInterrupt`` goes through, as Django's
  immediate backend lets it.

The signals are sent with ``send_robust`` (``asend_robust`` on an ``async def`` task's
event loop, where Django's sync receivers run on asgiref's thread): a receiver that
raises is logged by Django (``django.dispatch``) and changes nothing of the task.
``task_finished`` is sent before pgwork writes the outcome, so a receiver reading the
result back may still see it ``RUNNING``; an attempt the worker interrupts (timeout,
cancel, stop) sends none.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections
from django.utils import timezone

from pgwork.contrib.django._atomic import job_transaction
from pgwork.contrib.django._backend import PgworkBackend, TaskCall
from pgwork.contrib.django._compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    asend_robust,
    normalize_json,
    task_finished,
    task_started,
)
from pgwork.records import Job
from pgwork.worker import Attempt, SyncAttempt

__all__ = ["run_attempt", "run_attempt_async"]


def run_attempt(backend: PgworkBackend, task: Task, attempt: SyncAttempt[TaskCall, Any]) -> Any:
    """Run one attempt of a plain ``def`` task, on the worker's thread that runs it."""
    job = attempt.job if attempt.job.attempt == 1 else _read_job(backend, attempt.job)
    running = backend.result_of(job)
    sender = type(backend)
    task_started.send_robust(sender, task_result=running)
    try:
        # An ATOMIC backend's task writes through Django in the job's transaction.
        with job_transaction(backend, attempt):
            returned = task.func(*_arguments(task, job, running), **job.input["kwargs"])
        value = normalize_json(returned)
        attempt.complete(value)
    except (Exception, SystemExit) as exc:
        if job.attempt >= job.max_attempts:
            task_finished.send_robust(sender, task_result=_failed(running, exc))
        if isinstance(exc, SystemExit):
            raise _as_exception(exc) from None
        raise
    task_finished.send_robust(sender, task_result=_succeeded(running, value))
    return value


async def run_attempt_async(
    backend: PgworkBackend, task: Task, attempt: Attempt[TaskCall, Any]
) -> Any:
    """Run one attempt of an ``async def`` task, on the worker's event loop."""
    job = attempt.job
    if job.attempt > 1:
        job = await sync_to_async(_read_job_on_a_thread)(backend, job)
    running = backend.result_of(job)
    sender = type(backend)
    await asend_robust(task_started, sender, task_result=running)
    try:
        value = normalize_json(
            await task.func(*_arguments(task, job, running), **job.input["kwargs"])
        )
        await attempt.complete(value)
    except (Exception, SystemExit) as exc:
        if job.attempt >= job.max_attempts:
            await asend_robust(task_finished, sender, task_result=_failed(running, exc))
        if isinstance(exc, SystemExit):
            raise _as_exception(exc) from None
        raise
    await asend_robust(task_finished, sender, task_result=_succeeded(running, value))
    return value


def _arguments(task: Task, job: Job[TaskCall], running: TaskResult) -> list[Any]:
    args = list(job.input["args"])
    if task.takes_context:
        args.insert(0, TaskContext(task_result=running))
    return args


def _read_job(backend: PgworkBackend, job: Job[TaskCall]) -> Job[TaskCall]:
    """``job`` as its row stands, attempt history included, read on this thread's
    Django connection."""
    connection = connections[backend.database]
    connection.ensure_connection()
    found: Job[TaskCall] = backend.client.get_job_sync(connection.connection, job.id)
    return found


def _read_job_on_a_thread(backend: PgworkBackend, job: Job[TaskCall]) -> Job[TaskCall]:
    """``_read_job`` on asgiref's thread, its connection closed when too old or broken,
    as a request's are."""
    close_old_connections()
    try:
        return _read_job(backend, job)
    finally:
        close_old_connections()


def _succeeded(running: TaskResult, value: Any) -> TaskResult:
    result = _ended(running, TaskResultStatus.SUCCESSFUL, list(running.errors))
    object.__setattr__(result, "_return_value", value)
    return result


def _failed(running: TaskResult, exc: BaseException) -> TaskResult:
    kind = type(exc)
    error = TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )
    return _ended(running, TaskResultStatus.FAILED, [*running.errors, error])


def _ended(running: TaskResult, status: TaskResultStatus, errors: list[TaskError]) -> TaskResult:
    return dataclasses.replace(
        running,
        status=status,
        finished_at=timezone.now(),
        errors=errors,
        worker_ids=list(running.worker_ids),
    )


# One stand-in class per exception class it stands in for (``SystemExit`` and its
# subclasses): made once, not per failure.
_STAND_INS: dict[type[BaseException], type[Exception]] = {}


def _as_exception(exc: BaseException) -> Exception:
    """``exc`` as an ``Exception`` pgwork's worker fails the attempt with: of a class
    with the module and name of ``exc``'s (so the stored error names ``SystemExit``,
    as Django's backends' do), its arguments and its traceback."""
    kind = type(exc)
    stand_in = _STAND_INS.get(kind)
    if stand_in is None:
        stand_in = type(
            kind.__name__,
            (Exception,),
            {
                "__module__": kind.__module__,
                "__qualname__": kind.__qualname__,
                "__doc__": f"A task's {kind.__qualname__}, failing its attempt.",
            },
        )
        _STAND_INS[kind] = stand_in
    return stand_in(*exc.args).with_traceback(exc.__traceback__)
