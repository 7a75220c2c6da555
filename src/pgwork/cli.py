"""The ``pgwork`` command: the only module that reads argv and the environment.

Every subcommand is a function registered on the ``main`` group below. A ``PgworkError``
raised by any of them is printed as one red line on stderr (no traceback) and exits with
status 2, so scripts can tell "the command failed" from ``pgwork check``'s status 1,
"the schema is not at head".
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from functools import partial
from typing import Any, TypeVar
from uuid import UUID

import anyio
import anyio.abc
import click
from rich.console import Console, RenderableType
from rich.logging import RichHandler
from rich.markup import escape

from pgwork import _cli_views as views
from pgwork.adapters.state import WorkerRecord
from pgwork.client import Client, create_client
from pgwork.errors import ConfigurationError, PgworkError
from pgwork.job_types import JobTypeRegistry
from pgwork.postgres import migrate as migrations
from pgwork.postgres._connect import connect, redact_dsn
from pgwork.postgres.notify import PostgresNotifyAdapter
from pgwork.postgres.schema import DEFAULT_SCHEMA
from pgwork.postgres.state import PostgresStateAdapter
from pgwork.records import Chain, Job, JobStatus, Page

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOT_AT_HEAD", "main"]

EXIT_NOT_AT_HEAD = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def _stdout() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


class _Group(click.Group):
    """A click group that turns pgwork's errors into one readable line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (PgworkError, BaseExceptionGroup) as caught:
            exc = _pgwork_error(caught)
            if exc is None:
                raise
            message = " ".join(str(exc).split())
            _stderr().print(f"[bold red]error:[/] [red]{escape(message)}[/]")
            ctx.exit(EXIT_ERROR)


def _pgwork_error(exc: BaseException) -> PgworkError | None:
    """The PgworkError in ``exc``, also from inside the exception groups of task groups."""
    if isinstance(exc, PgworkError):
        return exc
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _pgwork_error(exc.exceptions[0])
    return None


def _require_dsn(dsn: str | None) -> str:
    if not dsn:
        raise click.UsageError("no database given: pass --dsn, or set PGWORK_DSN or DATABASE_URL")
    return dsn


dsn_option = click.option(
    "--dsn",
    envvar=["PGWORK_DSN", "DATABASE_URL"],
    show_envvar=True,
    help="PostgreSQL DSN, e.g. postgresql://user:password@host:5432/dbname.",
)
schema_option = click.option(
    "--schema",
    envvar="PGWORK_SCHEMA",
    show_envvar=True,
    default=DEFAULT_SCHEMA,
    show_default=True,
    help="Schema holding pgwork's tables.",
)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pgwork")
def main() -> None:
    """pgwork: durable background jobs stored in PostgreSQL."""


# --- schema -------------------------------------------------------------------------


@main.command(short_help="Create or upgrade pgwork's schema.")
@dsn_option
@schema_option
@click.option(
    "--revision",
    default="head",
    show_default=True,
    help="Revision to upgrade to ('head' or a revision id). pgwork never downgrades here.",
)
def migrate(dsn: str | None, schema: str, revision: str) -> None:
    """Create or upgrade pgwork's schema; safe to run from many processes at once."""
    dsn = _require_dsn(dsn)
    change = migrations.upgrade(dsn, schema=schema, revision=revision)
    where = escape(f"schema {schema!r} in {redact_dsn(dsn)}")
    if change.changed:
        _stdout().print(
            f"[green]migrated {where}: {change.before or '(none)'} -> {change.after}[/]"
        )
    else:
        _stdout().print(f"[green]{where} is already at {change.after}[/]")


@main.command(short_help="Exit 0 if the schema is at head, 1 if not.")
@dsn_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def check(dsn: str | None, schema: str, as_json: bool) -> None:
    """Exit 0 if the schema is at this pgwork's head revision, 1 if it is not."""
    status = migrations.check(_require_dsn(dsn), schema=schema)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "schema": status.schema,
                    "current": status.current,
                    "head": status.head,
                    "is_current": status.is_current,
                }
            )
        )
    elif status.is_current:
        _stdout().print(f"[green]schema {status.schema!r} is at head ({status.head})[/]")
    elif status.current is not None and status.current not in migrations.known_revisions():
        _stdout().print(
            f"[yellow]schema {status.schema!r} is at {status.current}, which this pgwork "
            f"(head {status.head}) does not know: it was migrated by a newer pgwork[/]"
        )
    else:
        _stdout().print(
            f"[yellow]schema {status.schema!r} is at {status.current or '(none)'}, "
            f"head is {status.head}: run `pgwork migrate`[/]"
        )
    if not status.is_current:
        raise SystemExit(EXIT_NOT_AT_HEAD)


# --- worker ------------------------------------------------------------------------


@main.command(short_help="Run a worker until SIGTERM or Ctrl-C.")
@click.argument("target", metavar="MODULE:ATTR")
@click.argument("more_queues", nargs=-1, metavar="")
@dsn_option
@click.option("--slots", type=click.IntRange(min=1), help="Attempts run at once (max_slots).")
@click.option(
    "--queues",
    multiple=True,
    help="Queues to take jobs from, in priority order: --queues high default low.",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0, min_open=True),
    help="Longest wait in seconds without a notification.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Level of the log lines on stderr (when your module configured none).",
)
def worker(
    target: str,
    more_queues: tuple[str, ...],
    dsn: str | None,
    slots: int | None,
    queues: tuple[str, ...],
    poll_interval: float | None,
    log_level: str,
) -> None:
    """Run the worker MODULE:ATTR until SIGTERM or Ctrl-C.

    ATTR is an InProcessWorker, or a function (sync or async) returning one. The
    function is called with the options you gave, by name: --dsn as dsn=, --slots as
    max_slots=, --queues as queues=, --poll-interval as poll_interval=. The current
    directory is importable, as with `python -m`.

    The first signal stops gracefully: no new jobs, in-flight attempts finish within the
    worker's grace period. A second one aborts them at once and hands their jobs back.
    """
    if more_queues and not queues:
        raise click.UsageError(f"unexpected argument {more_queues[0]!r} (only one MODULE:ATTR)")
    options: dict[str, Any] = {
        "max_slots": slots,
        "queues": _queue_list(queues + more_queues) or None,
        "poll_interval": poll_interval,
    }
    factory = _load_target(target)

    async def serve() -> None:
        built = await _build_worker(factory, target, dsn, options)
        _configure_worker_logging(log_level)
        try:
            await _run_until_signalled(built)
        finally:
            with anyio.CancelScope(shield=True):
                await built.client.close()

    anyio.run(serve)


def _queue_list(values: tuple[str, ...]) -> list[str]:
    return [q for value in values for q in value.split(",") if q]


def _load_target(target: str) -> object:
    """Import ``module:attr`` (``attr`` may be dotted) with the current directory on the path."""
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise ConfigurationError(
            f"worker target {target!r} is not MODULE:ATTR (e.g. myapp.jobs:worker)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module exists but imports something missing: show where
        raise ConfigurationError(f"cannot import {module_name!r} for {target!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigurationError(
                f"{module_name!r} has no attribute {attr!r} (from {target!r})"
            ) from None
    return found


async def _build_worker(
    found: object, target: str, dsn: str | None, options: dict[str, Any]
) -> Any:
    from pgwork.worker import InProcessWorker

    given = {name: value for name, value in options.items() if value is not None}
    if isinstance(found, InProcessWorker):
        if given:
            raise ConfigurationError(
                f"{target} is a worker built in advance, so --slots, --queues and "
                "--poll-interval cannot change it; export a function that builds it "
                "(e.g. def worker(dsn, max_slots=10): ...) to take them"
            )
        return found
    if not callable(found):
        raise ConfigurationError(
            f"{target} is a {type(found).__name__}, not an InProcessWorker or a function "
            "returning one"
        )
    kwargs = _factory_arguments(found, target, dsn, given)
    built = found(**kwargs)
    if inspect.isawaitable(built):
        built = await built
    if not isinstance(built, InProcessWorker):
        raise ConfigurationError(
            f"{target} returned a {type(built).__name__}, not an InProcessWorker "
            "(build one with pgwork.create_in_process_worker)"
        )
    return built


def _factory_arguments(
    factory: Callable[..., object], target: str, dsn: str | None, given: dict[str, Any]
) -> dict[str, Any]:
    """Match the options given to the factory's parameters, by name."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {"dsn": dsn, **given} if dsn else given
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    kwargs: dict[str, Any] = {}
    if "dsn" in parameters or takes_any:
        wanted = parameters.get("dsn")
        if dsn is not None:
            kwargs["dsn"] = dsn
        elif wanted is not None and wanted.default is inspect.Parameter.empty:
            raise click.UsageError(
                f"{target} needs a database: pass --dsn, or set PGWORK_DSN or DATABASE_URL"
            )
    flags = {"max_slots": "--slots", "queues": "--queues", "poll_interval": "--poll-interval"}
    for name, value in given.items():
        if name not in parameters and not takes_any:
            raise ConfigurationError(
                f"{flags[name]} was given but {target} takes no {name}= parameter; "
                f"add one to the function to accept it"
            )
        kwargs[name] = value
    return kwargs


def _configure_worker_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


async def _run_until_signalled(running: Any) -> None:
    """Run ``running`` (an InProcessWorker) until it stops or SIGINT/SIGTERM stop it."""
    async with anyio.create_task_group() as tasks:
        await tasks.start(_stop_on_signals, running.stop, tasks)
        await running.run()
        tasks.cancel_scope.cancel()


async def _stop_on_signals(
    stop: Callable[..., Coroutine[Any, Any, None]],
    tasks: anyio.abc.TaskGroup,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """First signal: graceful stop. Second: abort in-flight attempts and release them."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        received = 0
        async for signum in signals:
            received += 1
            name = signal.Signals(signum).name
            if received == 1:
                _stderr().print(
                    f"[yellow]{name}: stopping; in-flight jobs may finish "
                    "(send it again to abort them and hand them back)[/]"
                )
                tasks.start_soon(stop)
            else:
                _stderr().print(f"[yellow]{name}: aborting in-flight jobs[/]")
                tasks.start_soon(partial(stop, grace_period=0))


# --- demo --------------------------------------------------------------------------


@main.command(short_help="Run thousands of jobs and a chain, with a progress bar.")
@click.option(
    "--dsn",
    envvar="PGWORK_DSN",
    show_envvar=True,
    help="PostgreSQL to use; without it an embedded PostgreSQL is started and deleted.",
)
@click.option(
    "--schema",
    default="pgwork_demo",
    show_default=True,
    help="Schema for the demo's tables (migrated first).",
)
@click.option("--jobs", type=click.IntRange(min=1), default=5000, show_default=True)
@click.option("--slots", type=click.IntRange(min=1), default=32, show_default=True)
def demo(dsn: str | None, schema: str, jobs: int, slots: int) -> None:
    """Enqueue JOBS jobs and a three-step chain, work them off in-process, and report.

    Without --dsn (or PGWORK_DSN) a private PostgreSQL is started in a temporary
    directory and deleted afterwards. Ctrl-C (or SIGTERM) stops it gracefully.
    """
    from pgwork._demo import embedded_postgres

    out = _stdout()
    if dsn:
        code = _demo(dsn, schema=schema, jobs=jobs, slots=slots, out=out)
    else:
        out.print("[dim]starting an embedded PostgreSQL (deleted when the demo ends)...[/]")
        with embedded_postgres() as embedded:
            code = _demo(embedded, schema=schema, jobs=jobs, slots=slots, out=out)
    if code:
        raise SystemExit(code)


def _demo(dsn: str, *, schema: str, jobs: int, slots: int, out: Console) -> int:
    from pgwork._demo import Demo

    change = migrations.upgrade(dsn, schema=schema)
    out.print(f"[dim]schema {schema!r} in {escape(redact_dsn(dsn))}: {change.after}[/]")
    running = Demo(dsn, schema=schema, jobs=jobs, slots=slots, console=out)
    handler = RichHandler(console=_stderr(), show_path=False, level=logging.WARNING)
    events = logging.getLogger("pgwork")
    events.addHandler(handler)
    try:
        summary = anyio.run(_run_demo, running)
    finally:
        events.removeHandler(handler)
    rate = f"{summary.jobs_per_second:,.0f} jobs/s"
    out.print(
        f"[bold]{summary.processed:,}[/] of {summary.jobs:,} jobs ({jobs:,} squares + a "
        f"3-step chain) in "
        f"{summary.work_seconds:.2f}s ([bold green]{rate}[/]); enqueued in "
        f"{summary.enqueue_seconds:.2f}s; {summary.retries} retried, {summary.failed} failed"
    )
    output = summary.chain_output.model_dump_json() if summary.chain_output else "(none yet)"
    out.print(f"chain demo.fetch -> demo.parse -> demo.summarize: {summary.chain_status}")
    out.print(f"chain output: {escape(output)}")
    if not summary.finished:
        out.print("[yellow]stopped before all jobs were done[/]")
        return EXIT_INTERRUPTED
    return 0


async def _run_demo(running: Any) -> Any:
    async with anyio.create_task_group() as tasks:

        async def stop(*, grace_period: float | None = None) -> None:
            running.stop()

        await tasks.start(_stop_on_signals, stop, tasks)
        summary = await running.run()
        tasks.cancel_scope.cancel()
    return summary


# --- jobs, chains, queues, workers -----------------------------------------------------
#
# These commands need no job-type registry: the client's empty registry leaves inputs
# and outputs as the stored JSON, so an operator can look at any deployment's jobs.

T = TypeVar("T")

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document (stable keys) for scripts."
)


def _operate(dsn: str | None, schema: str, operation: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``operation`` on a client of ``schema`` at ``dsn``, closing it afterwards."""
    given = _require_dsn(dsn)

    async def run() -> T:
        state = await PostgresStateAdapter.connect(given, schema=schema, max_size=2)
        client = create_client(
            state_adapter=state,
            notify_adapter=PostgresNotifyAdapter(given, schema=schema),
            registry=JobTypeRegistry(),
            observers=[],
        )
        try:
            return await operation(client)
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()

    return anyio.run(run)


async def _committed(dsn: str, work: Callable[[object], Awaitable[T]]) -> T:
    """Run ``work`` in a transaction of its own and commit it; on any error the
    connection is closed uncommitted, so nothing of it (notices included) happens."""
    conn = await connect(dsn)
    try:
        result = await work(conn)
        await conn.commit()
        return result
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()


def _parse_ids(values: tuple[str, ...], what: str) -> list[UUID]:
    ids: list[UUID] = []
    for value in values:
        try:
            ids.append(UUID(value))
        except ValueError:
            raise ConfigurationError(
                f"{value!r} is not a {what} id: ids are UUIDs, as `pgwork jobs list` prints them"
            ) from None
    return list(dict.fromkeys(ids))


def _job_status(value: str | None) -> JobStatus | None:
    if value is None:
        return None
    try:
        return JobStatus(value.lower())
    except ValueError:
        known = ", ".join(JobStatus)
        raise ConfigurationError(f"unknown job status {value!r}; use one of {known}") from None


def _show(as_json: bool, data: Any, view: Callable[[int], RenderableType]) -> None:
    """Print ``data`` as JSON, or ``view(width)`` (a table fitted to the terminal)."""
    if as_json:
        click.echo(views.dumps(data))
    else:
        out = _stdout()
        out.print(view(out.width))


@main.group(short_help="List, show, retry and cancel jobs.")
def jobs() -> None:
    """List, show, retry and cancel jobs (no job-type registry needed)."""


@jobs.command("list", short_help="Jobs, newest first, a page at a time.")
@dsn_option
@schema_option
@click.option("--type", "type_name", help="Only jobs of this type.")
@click.option("--queue", help="Only jobs in this queue.")
@click.option("--status", help=f"Only jobs in this status: {', '.join(JobStatus)}.")
@click.option("--chain", "chain_id", help="Only the jobs of this chain.")
@click.option("--limit", type=int, default=50, show_default=True, help="Jobs per page (1-1000).")
@click.option("--cursor", help="Where the previous page ended (its printed next cursor).")
@json_option
def list_jobs(
    dsn: str | None,
    schema: str,
    type_name: str | None,
    queue: str | None,
    status: str | None,
    chain_id: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Jobs, newest first, one page at a time; prints the cursor of the next page."""
    chain = _parse_ids((chain_id,), "chain")[0] if chain_id is not None else None
    wanted = _job_status(status)

    async def read(client: Client) -> tuple[Page[Job[Any]], datetime]:
        page = await client.list_jobs(
            type_name=type_name,
            queue=queue,
            status=wanted,
            chain_id=chain,
            limit=limit,
            cursor=cursor,
        )
        return page, await client.state.now()

    page, now = _operate(dsn, schema, read)
    _show(as_json, views.job_page_json(page), lambda w: views.job_page_view(page, now, width=w))


@jobs.command("show", short_help="Every field of one job.")
@click.argument("job_id", metavar="ID")
@dsn_option
@schema_option
@json_option
def show_job(dsn: str | None, schema: str, job_id: str, as_json: bool) -> None:
    """Every field of one job, with its last error and traceback."""
    wanted = _parse_ids((job_id,), "job")[0]

    async def read(client: Client) -> tuple[Job[Any], datetime]:
        return await client.get_job(wanted), await client.state.now()

    job, now = _operate(dsn, schema, read)
    _show(as_json, views.job_json(job), lambda _: views.job_view(job, now))


@jobs.command("retry", short_help="Put failed jobs back to work.")
@click.argument("job_ids", nargs=-1, required=True, metavar="ID...")
@dsn_option
@schema_option
@click.option(
    "--front/--no-front",
    default=True,
    show_default=True,
    help="Run them ahead of what already waits in their queues.",
)
def retry_jobs(dsn: str | None, schema: str, job_ids: tuple[str, ...], front: bool) -> None:
    """Put failed jobs back to work with a fresh set of attempts (all or none)."""
    given, wanted = _require_dsn(dsn), _parse_ids(job_ids, "job")

    async def retry(client: Client) -> list[UUID]:
        return await _committed(given, lambda tx: client.retry(tx, wanted, front=front))

    for job_id in _operate(given, schema, retry):
        click.echo(f"retried {job_id}")


@jobs.command("cancel", short_help="Cancel the chains of jobs.")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@dsn_option
@schema_option
def cancel_jobs(dsn: str | None, schema: str, ids: tuple[str, ...]) -> None:
    """Cancel the chains of these jobs (or chains), all or none.

    Their pending jobs never run; a running job's worker is told to abort its attempt.
    """
    given, wanted = _require_dsn(dsn), _parse_ids(ids, "job or chain")

    async def cancel(client: Client) -> list[UUID]:
        return await _committed(given, lambda tx: client.cancel(tx, wanted))

    for chain_id in _operate(given, schema, cancel):
        click.echo(f"cancelled chain {chain_id}")


@main.group(short_help="Show a chain and its jobs.")
def chains() -> None:
    """Look at chains (no job-type registry needed)."""


@chains.command("show")
@click.argument("chain_id", metavar="ID")
@dsn_option
@schema_option
@json_option
def show_chain(dsn: str | None, schema: str, chain_id: str, as_json: bool) -> None:
    """A chain's status and output, and its jobs in order."""
    wanted = _parse_ids((chain_id,), "chain")[0]

    async def read(client: Client) -> tuple[Chain, list[Job[Any]], datetime]:
        chain = await client.get_chain(wanted)
        return chain, await client.list_chain_jobs(wanted), await client.state.now()

    chain, chain_jobs, now = _operate(dsn, schema, read)
    _show(
        as_json,
        views.chain_json(chain, chain_jobs),
        lambda w: views.chain_view(chain, chain_jobs, now, width=w),
    )


@main.group(invoke_without_command=True, short_help="Queue depths; pause and resume queues.")
@dsn_option
@schema_option
@json_option
@click.pass_context
def queues(ctx: click.Context, dsn: str | None, schema: str, as_json: bool) -> None:
    """Without a command: per queue, the jobs ready, scheduled, running, blocked and
    failed, how long the oldest ready job has waited, and whether the queue is paused."""
    if ctx.invoked_subcommand is not None:
        return
    counts = _operate(dsn, schema, lambda client: client.count_jobs())
    _show(as_json, views.queues_json(counts), lambda w: views.queues_view(counts, width=w))


def _group_connection(ctx: click.Context, dsn: str | None, schema: str) -> tuple[str | None, str]:
    """--dsn / --schema given before the subcommand (`pgwork queues --dsn X pause q`)."""
    given = ctx.parent.params if ctx.parent is not None else {}
    if ctx.get_parameter_source("schema") is click.core.ParameterSource.DEFAULT:
        schema = given.get("schema") or schema
    return dsn or given.get("dsn"), schema


@queues.command("pause")
@click.argument("name")
@dsn_option
@schema_option
@click.pass_context
def pause_queue(ctx: click.Context, name: str, dsn: str | None, schema: str) -> None:
    """Stop workers taking jobs from queue NAME; running attempts go on. The pause is
    stored, so it outlasts worker restarts."""
    dsn, schema = _group_connection(ctx, dsn, schema)
    _operate(dsn, schema, lambda client: client.pause_queue(name))
    click.echo(f"paused queue {name!r}: workers take no new jobs from it")


@queues.command("resume")
@click.argument("name")
@dsn_option
@schema_option
@click.pass_context
def resume_queue(ctx: click.Context, name: str, dsn: str | None, schema: str) -> None:
    """Let workers take jobs from queue NAME again (and wake them up)."""
    dsn, schema = _group_connection(ctx, dsn, schema)
    _operate(dsn, schema, lambda client: client.resume_queue(name))
    click.echo(f"resumed queue {name!r}")


@main.command(short_help="Registered workers and whether they are alive.")
@dsn_option
@schema_option
@click.option(
    "--dead-after",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds without a heartbeat after which a worker counts as dead.",
)
@json_option
def workers(dsn: str | None, schema: str, dead_after: float, as_json: bool) -> None:
    """Registered workers, newest first: host, pid, status, busy slots, queues, and the
    age of the last heartbeat (measured on the database's clock)."""

    async def read(client: Client) -> tuple[list[WorkerRecord], datetime]:
        return await client.list_workers(dead_after=dead_after), await client.state.now()

    found, now = _operate(dsn, schema, read)
    _show(
        as_json, views.workers_json(found, now), lambda w: views.workers_view(found, now, width=w)
    )


# --- further commands register on `main` below ------------------------------------------


if __name__ == "__main__":
    main()
