"""Tasks of an ATOMIC backend: the Django ORM writes in the job's own transaction.

A backend with ``OPTIONS: {"ATOMIC": True}`` declares its tasks' job types atomic, so
a plain ``def`` task runs as a sync handler that is lent the job's transaction as a
blocking psycopg connection (``SyncAttempt.connection``, ``pgwork.postgres._loan``).
While the task runs, Django's connection for the backend's ``DATABASE`` alias on the
task's thread is a wrapper of that very connection (``job_transaction``), with the
whole task inside one ``transaction.atomic()`` block, as a view is under
``ATOMIC_REQUESTS``: ``Model.objects.create(...)``, ``connection.cursor()`` and a
nested ``atomic()`` (a savepoint) all write in the job's transaction, which commits
with its completion or not at all.

What Django's own ``connect()`` does for a new connection is done here for the lent
one, except what would outlive the job on the worker's connection:

* the cursor class and the adapters (time zone, ``jsonb`` and ``inet`` loaded as text,
  ranges) Django's psycopg backend connects with are set on the lent connection
  object. The loan makes a new ``psycopg.Connection`` object over the worker's libpq
  connection for every attempt, so they never reach the worker's own connection
  object; its cache of prepared statements is shared with the worker's, so the
  ``prepare_threshold`` (which lives in that cache) is left as the worker set it;
* Django's ``SET TIME ZONE`` is a session setting, which would stay on the worker's
  connection after the job's commit: the zone is set with ``set_config(..., true)``,
  which ends with the job's transaction;
* no ``connection_created`` signal: the connection is not new, and a receiver's
  session ``SET`` would stay on the worker's connection for every later job.

``close_old_connections`` (Django's request cycle, or the task's own) leaves the
wrapper alone; closing it otherwise undoes the task's writes, as a connection closed
in a transaction loses its writes, and Django refuses every later query in the task.
When the task ends the thread gets its own connection back; the wrapper lets go of
the lent connection without closing it (the worker's), and can never open another.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError
from django.db.utils import load_backend
from psycopg.adapt import AdaptersMap

from pgwork.contrib.django._compat import InvalidTask, Task
from pgwork.errors import ConfigurationError

if TYPE_CHECKING:
    from pgwork.worker import SyncAttempt

__all__ = ["AtomicTaskError", "check_atomic_database", "check_atomic_task", "job_transaction"]


class TaskBackend(Protocol):
    """What is read here of a ``PgworkBackend``."""

    alias: str
    database: str
    atomic: bool


class AtomicTaskError(ConfigurationError, InvalidTask):  # type: ignore[misc]
    """A task an ATOMIC backend cannot run: an ``async def`` one. Django's ``InvalidTask``
    too, so it is refused where Django refuses a task (``@task``, ``using``)."""

    def __init__(self, alias: str, task: Task) -> None:
        self.alias = alias
        self.task = task
        super().__init__(
            f"the task {task.module_path!r} is an `async def`, and the task backend "
            f"{alias!r} is ATOMIC: Django's async ORM runs on other threads than the "
            "task, outside the job's transaction. Declare the task with a plain `def`, "
            "or give it a backend without ATOMIC (@task(backend=...))"
        )


def check_atomic_task(alias: str, task: Task) -> None:
    """Refuse an ``async def`` task on the ATOMIC backend ``alias``."""
    if inspect.iscoroutinefunction(task.func):
        raise AtomicTaskError(alias, task)


def check_atomic_database(backend: TaskBackend) -> None:
    """Refuse, when the worker is built, a database whose Django OPTIONS the job's
    transaction cannot honour: it is pgwork's, at READ COMMITTED, as the login role of
    the worker's DSN."""
    options = connections[backend.database].settings_dict.get("OPTIONS", {})
    where = f"DATABASES[{backend.database!r}] OPTIONS"
    level = options.get("isolation_level")
    if level is not None and level != psycopg.IsolationLevel.READ_COMMITTED:
        raise ConfigurationError(
            f"{where} sets isolation_level {level!r}, and the task backend "
            f"{backend.alias!r} is ATOMIC: its tasks write in the job's transaction, "
            "which runs at READ COMMITTED. Drop the option, or use a backend without "
            "ATOMIC"
        )
    if options.get("assume_role"):
        raise ConfigurationError(
            f"{where} sets assume_role, and the task backend {backend.alias!r} is "
            "ATOMIC: its tasks write in the job's transaction, as the role the worker "
            "logs in with (the backend's DSN). Drop the option, or use a backend "
            "without ATOMIC"
        )


@contextmanager
def job_transaction(backend: TaskBackend, attempt: SyncAttempt[Any, Any]) -> Iterator[None]:
    """Run the body with Django's connection for ``backend.database`` on this thread in
    the job's transaction, inside ``transaction.atomic()``: it ends by keeping the
    body's writes for the job's commit, or, if the body raised or asked for a rollback,
    by undoing them. A backend without ATOMIC runs the body as it is."""
    lent = attempt.connection
    if not backend.atomic or lent is None:
        yield
        return
    alias = backend.database
    own = connections[alias]
    wrapper = _wrapper_class(load_backend(own.settings_dict["ENGINE"]).DatabaseWrapper)(
        own.settings_dict, alias
    )
    connections[alias] = wrapper
    try:
        wrapper.adopt(lent, backend.alias)
        with transaction.atomic(using=alias):
            yield
    finally:
        connections[alias] = own
        wrapper.connection = None


@functools.cache
def _wrapper_class(base: Any) -> Any:
    """Django's ``DatabaseWrapper`` of the engine ``base``, over a lent connection."""

    class JobDatabaseWrapper(base):  # type: ignore[misc]
        """Django's connection for one task: the job's transaction, lent to the task's
        thread. It never opens, configures for the session, or closes a connection."""

        task_backend = ""
        # Django's, set in its __init__ (declared for the type checker).
        closed_in_transaction: bool
        run_on_commit: list[Any]

        def adopt(self, lent: psycopg.Connection[Any], task_backend: str) -> None:
            """Take ``lent`` as this wrapper's connection, as ``connect()`` would."""
            self.check_settings()
            self.task_backend = task_backend
            params = self.get_connection_params()
            lent.cursor_factory = params["cursor_factory"]
            # What psycopg's connect(context=...) does with Django's adapters.
            lent._adapters = AdaptersMap(params["context"].adapters)
            self.connection = lent
            # Bookkeeping only (``_set_autocommit``): the atomic block that wraps the
            # task turns it off, as it would on a connection in autocommit.
            self.autocommit = True
            BaseDatabaseWrapper.init_connection_state(self)  # the server version check
            zone = self.timezone_name
            if zone and lent.info.parameter_status("TimeZone") != zone:
                with self.cursor() as cursor:
                    cursor.execute("SELECT set_config('TimeZone', %s, true)", [zone])

        def get_new_connection(self, conn_params: Any) -> Any:
            raise psycopg.InterfaceError(
                "this connection was the job's transaction of a task that has ended: "
                "use django.db.connections inside the task, not kept from it"
            )

        def _set_autocommit(self, autocommit: bool) -> None:
            pass  # the job's transaction is the worker's; Django only keeps count

        def close_if_unusable_or_obsolete(self) -> None:
            pass  # the job's connection is the worker's for as long as the task runs

        def close(self) -> None:
            """Undo the task's writes (a closed connection's transaction is rolled
            back); Django then refuses every query until the task ends."""
            self.validate_thread_sharing()
            self.run_on_commit = []
            if self.closed_in_transaction or self.connection is None:
                return
            try:
                if self.in_atomic_block:
                    with self.wrap_database_errors:
                        self.connection.rollback()
            finally:
                if self.in_atomic_block:
                    self.closed_in_transaction = True
                    self.needs_rollback = True

        def on_commit(self, func: Callable[[], Any], robust: bool = False) -> None:
            raise TransactionManagementError(
                f"transaction.on_commit() in a task of the ATOMIC task backend "
                f"{self.task_backend!r}: the task's writes commit with its job, after "
                "the task has returned, and nothing is run after that commit. Enqueue "
                "a task instead (it is written in the job's transaction, so it exists "
                "once the job commits), or use a backend without ATOMIC"
            )

    return JobDatabaseWrapper
