"""The operator commands of ``pgwork``: jobs, chains, queues, workers and history.

Each is a click command or group defined here and attached to ``main`` by
``pgwork.cli`` (``main.add_command``); of its siblings this module imports only ``_common``,
``_operate``, ``_views`` and ``_history_views``. They need no job-type registry: the client's empty
registry leaves inputs and outputs as the stored JSON, so an operator can look at any
deployment's jobs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import click

from pgwork.adapters.state import QueueCount, WorkerRecord
from pgwork.cli import _history_views as history_views
from pgwork.cli import _views as views
from pgwork.cli._common import dsn_option, require_dsn, schema_option
from pgwork.cli._operate import committed, group_connection, json_option, operate, show
from pgwork.client import Client
from pgwork.errors import ConfigurationError
from pgwork.records import Chain, Job, JobStatus, Page, Waiting

__all__ = ["chains", "history", "jobs", "queues", "workers"]


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


@click.group(short_help="List, show, retry and cancel jobs.")
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

    page, now = operate(dsn, schema, read)
    show(as_json, views.job_page_json(page), lambda w: views.job_page_view(page, now, width=w))


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

    job, now = operate(dsn, schema, read)
    show(as_json, views.job_json(job), lambda _: views.job_view(job, now))


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
    given, wanted = require_dsn(dsn), _parse_ids(job_ids, "job")

    async def retry(client: Client) -> list[UUID]:
        return await committed(given, lambda tx: client.retry(tx, wanted, front=front))

    for job_id in operate(given, schema, retry):
        click.echo(f"retried {job_id}")


@jobs.command("cancel", short_help="Cancel the chains of jobs.")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@dsn_option
@schema_option
def cancel_jobs(dsn: str | None, schema: str, ids: tuple[str, ...]) -> None:
    """Cancel the chains of these jobs (or chains), all or none.

    Their pending jobs never run; a running job's worker is told to abort its attempt.
    """
    given, wanted = require_dsn(dsn), _parse_ids(ids, "job or chain")

    async def cancel(client: Client) -> list[UUID]:
        return await committed(given, lambda tx: client.cancel(tx, wanted))

    for chain_id in operate(given, schema, cancel):
        click.echo(f"cancelled chain {chain_id}")


@click.group(short_help="Show a chain and its jobs; list waiting chains.")
def chains() -> None:
    """Look at chains (no job-type registry needed)."""


@chains.command("show")
@click.argument("chain_id", metavar="ID")
@dsn_option
@schema_option
@json_option
def show_chain(dsn: str | None, schema: str, chain_id: str, as_json: bool) -> None:
    """A chain's status and output, what its current step waits for (a signal, a
    time, a debounce, blocker chains), and its jobs in order."""
    wanted = _parse_ids((chain_id,), "chain")[0]

    async def read(client: Client) -> tuple[Chain, list[Job[Any]], Waiting | None, datetime]:
        chain = await client.get_chain(wanted)
        chain_jobs = await client.list_chain_jobs(wanted)
        return chain, chain_jobs, await client.waiting(chain.id), await client.state.now()

    chain, chain_jobs, waiting, now = operate(dsn, schema, read)
    show(
        as_json,
        views.chain_json(chain, chain_jobs, waiting),
        lambda w: views.chain_view(chain, chain_jobs, now, width=w, waiting=waiting),
    )


@click.group(invoke_without_command=True, short_help="Queue depths; pause and resume queues.")
@dsn_option
@schema_option
@json_option
@click.pass_context
def queues(ctx: click.Context, dsn: str | None, schema: str, as_json: bool) -> None:
    """Without a command: per queue, the jobs ready, scheduled, leased (running, or
    prefetched and waiting for a slot), blocked and failed, how long the oldest ready
    job has waited, and whether the queue is paused."""
    if ctx.invoked_subcommand is not None:
        return

    async def read(client: Client) -> tuple[list[QueueCount], int, list[views.Unhandled]]:
        live = [w for w in await client.list_workers() if w.alive]
        counts = await client.count_jobs()
        unhandled = await _unhandled(client, counts, live)
        return counts, sum(w.active_slots for w in live), unhandled

    counts, in_handlers, unhandled = operate(dsn, schema, read)
    show(
        as_json,
        views.queues_json(counts, unhandled),
        lambda w: views.queues_view(counts, width=w, in_handlers=in_handlers, unhandled=unhandled),
    )


# Job types pending in a queue are read from its newest pending jobs, a page of the
# listing's index: a type no worker handles keeps its jobs there while the others drain.
UNHANDLED_SAMPLE = 200


async def _unhandled(
    client: Client, counts: list[QueueCount], live: list[WorkerRecord]
) -> list[views.Unhandled]:
    """Ready work of unpaused queues that no live worker will take: a queue none of
    them takes jobs from, or a job type (among the newest pending jobs of the queue)
    that none of those taking from the queue handles. Nothing else would tell: such
    jobs stay pending with no error and no log line."""
    found: list[views.Unhandled] = []
    for count in counts:
        if not count.ready or count.paused:
            continue
        takers = [w for w in live if count.queue in w.queues]
        if not takers:
            found.append(views.Unhandled(count.queue, None, count.ready))
            continue
        handled = {name for w in takers for name in w.job_types}
        page = await client.list_jobs(
            queue=count.queue, status=JobStatus.PENDING, limit=UNHANDLED_SAMPLE
        )
        pending = {job.type_name for job in page.items}
        found.extend(views.Unhandled(count.queue, name) for name in sorted(pending - handled))
    return found


@queues.command("pause")
@click.argument("name")
@dsn_option
@schema_option
@click.pass_context
def pause_queue(ctx: click.Context, name: str, dsn: str | None, schema: str) -> None:
    """Stop workers taking jobs from queue NAME; running attempts go on. The pause is
    stored, so it outlasts worker restarts."""
    dsn, schema = group_connection(ctx, dsn, schema)
    operate(dsn, schema, lambda client: client.pause_queue(name))
    click.echo(f"paused queue {name!r}: workers take no new jobs from it")


@queues.command("resume")
@click.argument("name")
@dsn_option
@schema_option
@click.pass_context
def resume_queue(ctx: click.Context, name: str, dsn: str | None, schema: str) -> None:
    """Let workers take jobs from queue NAME again (and wake them up)."""
    dsn, schema = group_connection(ctx, dsn, schema)
    operate(dsn, schema, lambda client: client.resume_queue(name))
    click.echo(f"resumed queue {name!r}")


@click.command(short_help="Registered workers and whether they are alive.")
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

    found, now = operate(dsn, schema, read)
    show(as_json, views.workers_json(found, now), lambda w: views.workers_view(found, now, width=w))


HISTORY_WINDOWS = {
    "1d": "last day",
    "7d": "last week",
    "30d": "last 30 days",
    "90d": "last 90 days",
}


@click.command(short_help="Throughput, wait and run time over days, per queue and type.")
@dsn_option
@schema_option
@click.option(
    "--window",
    type=click.Choice(list(HISTORY_WINDOWS)),
    default="1d",
    show_default=True,
    help="How far back.",
)
@click.option("--queue", default=None, help="Only this queue.")
@click.option("--type", "type_name", default=None, help="Only this job type.")
@json_option
def history(
    dsn: str | None,
    schema: str,
    window: str,
    queue: str | None,
    type_name: str | None,
    as_json: bool,
) -> None:
    """Jobs that completed and failed within the window, per queue and type, with their
    median and 95th percentile wait and run time, from the job history the workers'
    maintenance counts (it outlives retention; docs/dashboard.md, "History"). --json
    adds the figures per step of the window."""
    span = timedelta(days=int(window[:-1]))

    async def read(client: Client) -> Any:
        return await client.job_history(window=span, queue=queue, type_name=type_name)

    found = operate(dsn, schema, read)
    title = HISTORY_WINDOWS[window]
    show(
        as_json,
        history_views.history_json(found),
        lambda _: history_views.history_view(found, title),
    )
