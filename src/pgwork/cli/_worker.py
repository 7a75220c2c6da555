"""``pgwork worker MODULE:ATTR``: import the user's worker and run it until a signal stops it.

What MODULE:ATTR names is turned into a worker by ``_worker_target``; this module owns the
parts that touch the process: the import path, logging to stderr, signals, the exit status.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import anyio
import click

from pgwork.cli._app import EXIT_ABANDONED
from pgwork.cli._common import LOOPS, dsn_option, loop_options, stop_on_signals
from pgwork.cli._targets import load_target
from pgwork.cli._worker_target import build_worker
from pgwork.worker import tune_gc

__all__ = ["worker"]


@click.command(short_help="Run a worker until SIGTERM or Ctrl-C.")
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
    "--notify-dsn",
    envvar="PGWORK_NOTIFY_DSN",
    show_envvar=True,
    help="A direct DSN for LISTEN/NOTIFY, when --dsn goes through a transaction pooler "
    "(PgBouncer, a hosted pooler): passed as notify_dsn=.",
)
@click.option(
    "--no-prepare",
    is_flag=True,
    help="Passed as prepare_threshold=None: no server-side prepared statements, as a "
    "transaction pooler behind --dsn needs.",
)
@click.option(
    "--no-gc-tuning",
    is_flag=True,
    help="Leave Python's garbage collector as it is (by default the worker freezes what "
    "the application allocated at start and collects young objects less often: "
    "pgwork.worker.tune_gc).",
)
@click.option(
    "--loop",
    type=click.Choice(LOOPS),
    default="auto",
    show_default=True,
    help="The event loop: uvloop (pip install 'pgwork[uvloop]'), asyncio's own, or "
    "auto: uvloop when it is installed.",
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
    notify_dsn: str | None,
    no_prepare: bool,
    no_gc_tuning: bool,
    loop: str,
    log_level: str,
) -> None:
    """Run the worker MODULE:ATTR until SIGTERM or Ctrl-C.

    ATTR is an InProcessWorker, or a function (sync or async) returning one. The
    function is called with the options you gave, by name: --dsn as dsn=, --slots as
    max_slots=, --queues as queues=, --poll-interval as poll_interval=, --notify-dsn as
    notify_dsn=, --no-prepare as prepare_threshold=None. The current directory is
    importable, as with `python -m`.

    Behind a transaction pooler: --dsn PGBOUNCER_DSN --no-prepare --notify-dsn DIRECT_DSN
    (see docs/deploying.md).

    The first signal stops gracefully: no new jobs, in-flight attempts finish within the
    worker's grace period. A second one aborts them at once and hands their jobs back.
    """
    if more_queues and not queues:
        raise click.UsageError(f"unexpected argument {more_queues[0]!r} (only one MODULE:ATTR)")
    options: dict[str, Any] = {
        "max_slots": slots,
        "queues": _queue_list(queues + more_queues) or None,
        "poll_interval": poll_interval,
        "notify_dsn": notify_dsn,
    }
    if no_prepare:
        options["prepare_threshold"] = None
    backend_options = loop_options(loop)
    # A --dsn typed on the command line must reach the worker; one from the environment
    # may be meant for the rest of the application, so a factory without dsn= ignores it.
    source = click.get_current_context().get_parameter_source("dsn")
    dsn_given = source is click.core.ParameterSource.COMMANDLINE
    factory = load_target(target, what="worker target", example="myapp.jobs:worker")

    async def serve() -> None:
        built = await build_worker(factory, target, dsn, options, dsn_given=dsn_given)
        _configure_worker_logging(log_level)
        if not no_gc_tuning:
            tune_gc()  # the application is loaded: what it allocated stays for good
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

    anyio.run(serve, backend_options=backend_options)


def _queue_list(values: tuple[str, ...]) -> list[str]:
    return [q for value in values for q in value.split(",") if q]


def _configure_worker_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


async def _run_until_signalled(running: Any) -> None:
    """Run ``running`` (an InProcessWorker) until it stops or SIGINT/SIGTERM stop it."""
    async with anyio.create_task_group() as tasks:
        await tasks.start(stop_on_signals, running.stop, tasks)
        await running.run()
        tasks.cancel_scope.cancel()
