"""``pgwork demo``: the command line and signals around the demo workload in ``_demo_run``."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import click
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from pgwork.cli._app import EXIT_INTERRUPTED
from pgwork.cli._common import load_migrations, stderr, stdout, stop_on_signals
from pgwork.postgres.connect import redact_dsn

__all__ = ["demo"]


@click.command(short_help="Run thousands of jobs and a chain, with a progress bar.")
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
    from pgwork.cli._demo_run import embedded_postgres

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
    from pgwork.cli._demo_run import Demo

    change = load_migrations().upgrade(dsn, schema=schema)
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

        await tasks.start(stop_on_signals, stop, tasks)
        summary = await running.run()
        tasks.cancel_scope.cancel()
    return summary
