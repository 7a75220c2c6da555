"""The work pages: jobs by status, queues with who consumes them, workers with what
they run, failures grouped by error, jobs by id prefix or by an input field.

What an operator looks at when work seems stuck: every page is one or a few client
reads over bounded index ranges (the ``list_work`` family), never a count of the table
and never a window of chains filtered row by row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pgwork._input_search import parse_input_value
from pgwork.adapters.state import QueueCount, WorkerRecord
from pgwork.adapters.work import PendingType, WorkerJobs, WorkStatus
from pgwork.dashboard._context import Context, bounded
from pgwork.errors import (
    ConfigurationError,
    DatabaseTimeoutError,
    DatabaseUnreachableError,
    PgworkError,
)
from pgwork.records import Chain, Job
from pgwork.schedules import CronSchedule

__all__ = ["ScheduleView", "WorkPages", "WorkerView", "held_by_worker", "worker_views"]

PAGE_SIZE = 50
DEAD_AFTER = 30.0
# Running jobs the workers page lists for each worker; it links to the rest.
JOBS_PER_WORKER = 10
# Oldest ready jobs read per queue and priority to find types nobody handles.
TYPE_SAMPLE = 100
# Newest failed jobs grouped on the errors page.
ERROR_SAMPLE = 10_000
# Jobs looked at per page of a search by input field (newest first, every type).
INPUT_EXAMINED = 10_000


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A worker as the pages show it. ``state``: its own status while its heartbeat is
    fresh; ``stopped`` once it stopped cleanly (its last heartbeat said so, holding no
    job); otherwise ``dead``: silent, or declared dead with work in hand, so its jobs
    wait for their leases to lapse and are taken back. ``running``: the jobs it holds,
    of which ``jobs`` are the first few it started."""

    worker: WorkerRecord
    state: str
    jobs: tuple[Job[Any], ...]
    running: int


def held_by_worker(jobs: Iterable[Job[Any]]) -> list[WorkerJobs]:
    """Running ``jobs`` grouped by the worker holding them, each group counting only
    the jobs given: for pages that show a few running jobs, not every worker's."""
    by_worker: dict[str, list[Job[Any]]] = defaultdict(list)
    for job in jobs:
        if job.leased_by is not None:
            by_worker[job.leased_by].append(job)
    return [
        WorkerJobs(worker_id=w, running=len(js), oldest=tuple(js)) for w, js in by_worker.items()
    ]


def worker_views(workers: Iterable[WorkerRecord], held: Iterable[WorkerJobs]) -> list[WorkerView]:
    by_worker = {h.worker_id: h for h in held}
    views = []
    for w in workers:
        found = by_worker.get(w.id)
        jobs, running = (found.oldest, found.running) if found else ((), 0)
        if w.alive:
            state = w.status
        elif w.status == "stopped" and w.active_slots == 0 and not running:
            state = "stopped"
        else:
            state = "dead"
        views.append(WorkerView(worker=w, state=state, jobs=jobs, running=running))
    return views


@dataclass(frozen=True, slots=True)
class QueueView:
    count: QueueCount
    consumers: tuple[str, ...]
    unhandled: tuple[PendingType, ...]

    @property
    def unconsumed(self) -> bool:
        """Work waits and no live worker takes jobs from this queue."""
        return not self.consumers and self.count.ready + self.count.scheduled > 0


def queue_views(
    counts: Sequence[QueueCount], workers: Sequence[WorkerRecord], types: Sequence[PendingType]
) -> list[QueueView]:
    live = [w for w in workers if w.alive]
    views = []
    for count in counts:
        consumers = [w for w in live if count.queue in w.queues]
        handled = {t for w in consumers for t in w.job_types}
        unhandled = tuple(t for t in types if t.queue == count.queue and t.type_name not in handled)
        views.append(QueueView(count, tuple(w.id for w in consumers), unhandled))
    return views


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A cron schedule, when it fires next, and its latest tick with the chain that
    tick started (``None``: none yet; ``missed`` once its grace has passed)."""

    schedule: CronSchedule[Any]
    next_at: datetime
    latest_at: datetime
    latest_chain: Chain | None
    missed: bool


class WorkPages:
    def __init__(self, context: Context, *, schedules: tuple[CronSchedule[Any], ...] = ()) -> None:
        self.ctx = context
        self.cron = schedules

    @bounded
    async def jobs(self, request: Request) -> Response:
        status = _param(request, "status") or WorkStatus.READY.value
        filters = {
            "status": status,
            "queue": _param(request, "queue"),
            "worker": _param(request, "worker"),
            # Exact, unstripped: they are matched against the stored error as is.
            "error_type": request.query_params.get("error_type") or None,
            "error_message": request.query_params.get("error_message") or None,
            "order": "newest" if _param(request, "order") == "newest" else "oldest",
        }
        client = self.ctx.client
        try:
            page = await client.list_work(
                status=status,
                queue=filters["queue"],
                leased_by=filters["worker"],
                error_type=filters["error_type"],
                error_message=filters["error_message"],
                oldest_first=filters["order"] == "oldest",
                cursor=_param(request, "cursor"),
                limit=PAGE_SIZE,
            )
        except PgworkError as exc:
            return self.ctx.error(request, 400, "Bad filter", str(exc))
        workers: dict[str, WorkerView] = {}
        if filters["status"] == WorkStatus.RUNNING.value:
            listed = await client.list_workers(dead_after=DEAD_AFTER)
            views = worker_views(listed, held_by_worker(page.items))
            workers = {v.worker.id: v for v in views}
        return self.ctx.render(
            request,
            "jobs.html",
            page=page,
            filters=filters,
            statuses=[s.value for s in WorkStatus],
            workers=workers,
            here=f"/jobs?{request.url.query}",
            refresh=True,
        )

    @bounded
    async def queues(self, request: Request) -> Response:
        client = self.ctx.client
        counts = await client.count_jobs()
        workers = await client.list_workers(dead_after=DEAD_AFTER)
        types = await client.pending_types(sample=TYPE_SAMPLE)
        return self.ctx.render(
            request,
            "queues.html",
            queues=queue_views(counts, workers, types),
            type_sample=TYPE_SAMPLE,
            refresh=True,
        )

    @bounded
    async def workers(self, request: Request) -> Response:
        client = self.ctx.client
        workers = await client.list_workers(dead_after=DEAD_AFTER)
        held = await client.running_by_worker(per_worker=JOBS_PER_WORKER)
        return self.ctx.render(
            request, "workers.html", workers=worker_views(workers, held), refresh=True
        )

    @bounded
    async def errors(self, request: Request) -> Response:
        groups = await self.ctx.client.error_groups(sample=ERROR_SAMPLE, limit=PAGE_SIZE)
        return self.ctx.render(request, "errors.html", groups=groups, sample=ERROR_SAMPLE)

    @bounded
    async def schedules(self, request: Request) -> Response:
        client = self.ctx.client
        now = datetime.now(UTC)
        views = []
        for schedule in self.cron:
            latest = schedule.latest_tick(now)
            found = await client.list_chains(
                type_name=schedule.job_type.name, dedup_key=schedule.dedup(latest).key, limit=1
            )
            chain = found.items[0] if found.items else None
            views.append(
                ScheduleView(
                    schedule=schedule,
                    next_at=schedule.next_tick(now),
                    latest_at=latest,
                    latest_chain=chain,
                    missed=chain is None and now - latest > schedule.misfire_grace,
                )
            )
        return self.ctx.render(request, "schedules.html", schedules=views, refresh=True)

    @bounded
    async def search(self, request: Request) -> Response:
        if any(_param(request, name) for name in ("type", "field", "value")):
            return await self._search_input(request)
        prefix = _param(request, "id")
        found: list[Job[Any]] = []
        if prefix is not None:
            try:
                found = await self.ctx.client.find_by_id_prefix(prefix, limit=PAGE_SIZE + 1)
            except PgworkError as exc:
                return self.ctx.error(request, 400, "Bad id", str(exc))
            if len(found) == 1:
                job = found[0]
                path = f"/chains/{job.id}" if job.id == job.chain_id else f"/jobs/{job.id}"
                return RedirectResponse(self.ctx.url(request, path), status_code=303)
        return self.ctx.render(
            request,
            "search.html",
            prefix=prefix,
            found=found[:PAGE_SIZE],
            more=len(found) > PAGE_SIZE,
            search=None,
            problem=None,
            page=None,
            known_types=self.ctx.client.registry.names,
            examined_per_page=INPUT_EXAMINED,
        )

    async def _search_input(self, request: Request) -> Response:
        """Jobs of one type by an input field, over the newest ``INPUT_EXAMINED`` jobs
        (from the cursor on): the page says how far back it looked and links further."""
        search = {
            "type": _param(request, "type") or "",
            "field": _param(request, "field") or "",
            "value": _param(request, "value") or "",
        }
        page = None
        problem = None
        try:
            if not search["type"]:
                raise ConfigurationError("choose the job type whose inputs are searched")
            page = await self.ctx.client.find_by_input(
                search["type"],
                search["field"],
                parse_input_value(search["value"]),
                examine=INPUT_EXAMINED,
                limit=PAGE_SIZE,
                cursor=_param(request, "cursor"),
            )
        except (DatabaseUnreachableError, DatabaseTimeoutError):
            raise  # answered 503 by the page bound, not a bad search
        except PgworkError as exc:
            problem = str(exc)
        return self.ctx.render(
            request,
            "search.html",
            status_code=400 if problem else 200,
            prefix=None,
            search=search,
            problem=problem,
            page=page,
            known_types=self.ctx.client.registry.names,
            examined_per_page=INPUT_EXAMINED,
        )
