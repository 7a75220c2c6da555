"""The ``pgwork`` command: the only module that reads argv and the environment.

Every subcommand is registered on the ``main`` group below; the operator commands (jobs,
chains, queues, workers) are defined in ``_cli_operator`` and attached here. A
``PgworkError`` raised by any of them is printed as one red line on stderr (no traceback)
and exits with status 2, so scripts can tell "the command failed" from ``pgwork check``'s
status 1, "the schema is not at head".
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from functools import partial
from types import ModuleType
from typing import Any

import anyio
import anyio.abc
import click
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from pgwork._cli_common import dsn_option, require_dsn, schema_option, stderr, stdout
from pgwork._cli_dashboard import dashboard
from pgwork._cli_operator import chains, jobs, queues, workers
from pgwork._cli_worker_target import build_worker
from pgwork.errors import ConfigurationError, PgworkError
from pgwork.postgres._connect import redact_dsn

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOT_AT_HEAD", "main"]

EXIT_NOT_AT_HEAD = 1
EXIT_ERROR = 2
# The worker stopped, but handlers that ignored cancellation were still running: the
# process ends without waiting for them (Python cannot stop them any other way).
EXIT_ABANDONED = 3
EXIT_INTERRUPTED = 130


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
            stderr().print(f"[bold red]error:[/] [red]{escape(message)}[/]")
            ctx.exit(EXIT_ERROR)


def _pgwork_error(exc: BaseException) -> PgworkError | None:
    """The PgworkError in ``exc``, also from inside the exception groups of task groups."""
    if isinstance(exc, PgworkError):
        return exc
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _pgwork_error(exc.exceptions[0])
    return None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pgwork")
def main() -> None:
    """pgwork: durable background jobs stored in PostgreSQL."""


# --- schema -------------------------------------------------------------------------


def _migrations() -> ModuleType:
    """Alembic, and SQLAlchemy under it, load only for the commands that migrate: the
    others (a worker above all) start without them."""
    from pgwork.postgres import migrate

    return migrate


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
    migrations = _migrations()
    dsn = require_dsn(dsn)
    change = migrations.upgrade(dsn, schema=schema, revision=revision)
    where = escape(f"schema {schema!r} in {redact_dsn(dsn)}")
    if change.changed:
        stdout().print(f"[green]migrated {where}: {change.before or '(none)'} -> {change.after}[/]")
    else:
        stdout().print(f"[green]{where} is already at {change.after}[/]")


@main.command(short_help="Exit 0 if the schema is at head, 1 if not.")
@dsn_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def check(dsn: str | None, schema: str, as_json: bool) -> None:
    """Exit 0 if the schema is at this pgwork's head revision, 1 if it is not."""
    migrations = _migrations()
    status = migrations.check(require_dsn(dsn), schema=schema)
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
        stdout().print(f"[green]schema {status.schema!r} is at head ({status.head})[/]")
    elif status.current is not None and status.current not in migrations.known_revisions():
        stdout().print(
            f"[yellow]schema {status.schema!r} is at {status.current}, which this pgwork "
            f"(head {status.head}) does not know: it was migrated by a newer pgwork[/]"
        )
    else:
        stdout().print(
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
        built = await build_worker(factory, target, dsn, options)
        _configure_worker_logging(log_level)
        try:
            await _run_until_signalled(built)
        finally:
            with anyio.CancelScope(shield=True):
                await built.client.close()
        if built.abandoned_handlers:
            # asyncio.run would wait for them at shutdown, for ever: their jobs are
            # settled already, so end the process here.
            logging.getLogger("pgwork.worker").error(
                "pgwork worker: %d abandoned handler(s) still running after the worker "
                "stopped; exiting without them",
                built.abandoned_handlers,
            )
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_ABANDONED)

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
                stderr().print(
                    f"[yellow]{name}: stopping; in-flight jobs may finish "
                    "(send it again to abort them and hand them back)[/]"
                )
                tasks.start_soon(stop)
            else:
                stderr().print(f"[yellow]{name}: aborting in-flight jobs[/]")
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

    out = stdout()
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

    change = _migrations().upgrade(dsn, schema=schema)
    out.print(f"[dim]schema {schema!r} in {escape(redact_dsn(dsn))}: {change.after}[/]")
    running = Demo(dsn, schema=schema, jobs=jobs, slots=slots, console=out)
    handler = RichHandler(console=stderr(), show_path=False, level=logging.WARNING)
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


# --- jobs, chains, queues, workers: defined in _cli_operator ----------------------------

main.add_command(jobs)
main.add_command(chains)
main.add_command(queues)
main.add_command(workers)
main.add_command(dashboard)

# --- further commands register on `main` below ------------------------------------------


if __name__ == "__main__":
    main()
