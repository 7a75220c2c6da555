"""The read pages: overview, chains, a chain, a job, workers, failed jobs.

Each is one or a few client reads over bounded index ranges (keyset pages, partial
indexes, the ended jobs' index for the last hour), never a count of the whole table,
and bounded in time. Filters are query parameters, so every view is a URL to bookmark
or share.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pgwork.dashboard import _format
from pgwork.dashboard._context import Context, bounded
from pgwork.dashboard._work_pages import held_by_worker, worker_views
from pgwork.errors import (
    ChainNotFoundError,
    DatabaseTimeoutError,
    DatabaseUnreachableError,
    JobNotFoundError,
    PgworkError,
)
from pgwork.records import (
    ATTEMPT_HISTORY_LIMIT,
    HISTORY_TRACEBACK_LIMIT,
    Chain,
    ChainStatus,
    JobStatus,
    Page,
)

__all__ = ["Pages"]

PAGE_SIZE = 50
# A queue filter is applied to this many chains of the listing per page (read as pages
# of PAGE_SIZE, the size the listing's plan is made for): no index has the queue of
# finished chains, so a page reads a bounded window and may show fewer rows than it
# read (its next link continues after the window, so nothing is skipped).
QUEUE_WINDOW = 4 * PAGE_SIZE
WINDOW = timedelta(hours=1)
BUCKET = timedelta(minutes=2)
DEAD_AFTER = 30.0


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


def _uuid(value: str | None) -> UUID | None:
    try:
        return UUID(value) if value else None
    except ValueError:
        return None


class Pages:
    def __init__(self, context: Context) -> None:
        self.ctx = context

    @bounded
    async def overview(self, request: Request) -> Response:
        client = self.ctx.client
        counts = await client.count_jobs()
        activity = await client.recent_activity(window=WINDOW, bucket=BUCKET)
        workers = await client.list_workers(dead_after=DEAD_AFTER)
        finished = _format.per_queue(activity.buckets)
        queues = sorted({c.queue for c in counts} | set(finished))
        by_name = {c.queue: c for c in counts}
        rows = [(name, by_name.get(name), finished.get(name, (0, 0))) for name in queues]
        return self.ctx.render(
            request,
            "overview.html",
            rows=rows,
            activity=activity,
            chart=_format.chart(
                activity.buckets,
                now=activity.now,
                window=WINDOW,
                bucket=BUCKET,
                counted_from=activity.counted_from,
            ),
            workers=[w for w in workers if w.alive],
            dead_workers=sum(1 for v in worker_views(workers, ()) if v.state == "dead"),
            refresh=True,
        )

    @bounded
    async def chains(self, request: Request) -> Response:
        filters = {
            "status": _param(request, "status"),
            "type": _param(request, "type"),
            "queue": _param(request, "queue"),
            "q": _param(request, "q"),
        }
        client = self.ctx.client
        wanted = _uuid(filters["q"])
        if wanted is not None:
            found = await self._find(wanted)
            if found is not None:
                return RedirectResponse(self.ctx.url(request, found), status_code=303)
        queue = filters["queue"]
        cursor = _param(request, "cursor")
        shown: list[Chain] = []
        try:
            for _ in range(QUEUE_WINDOW // PAGE_SIZE if queue else 1):
                page = await client.list_chains(
                    status=filters["status"],
                    type_name=filters["type"],
                    dedup_key=filters["q"] if wanted is None else None,
                    cursor=cursor,
                    limit=PAGE_SIZE,
                )
                shown += [c for c in page.items if not queue or c.current_job.queue == queue]
                cursor = page.next_cursor
                if cursor is None or len(shown) >= PAGE_SIZE:
                    break
        except (DatabaseUnreachableError, DatabaseTimeoutError):
            raise  # answered 503 by the security middleware, not a bad filter
        except PgworkError as exc:
            return self.ctx.error(request, 400, "Bad filter", str(exc))
        page = Page(items=tuple(shown), next_cursor=cursor)
        if wanted is not None:  # a UUID that names no chain and no job
            page = Page(items=())
        return self.ctx.render(
            request,
            "chains.html",
            page=page,
            filters=filters,
            statuses=[s.value for s in ChainStatus],
            searched_id=wanted,
            queue_window=QUEUE_WINDOW if queue else None,
        )

    async def _find(self, wanted: UUID) -> str | None:
        client = self.ctx.client
        try:
            return f"/chains/{(await client.get_chain(wanted)).id}"
        except ChainNotFoundError:
            pass
        try:
            return f"/jobs/{(await client.get_job(wanted)).id}"
        except JobNotFoundError:
            return None

    @bounded
    async def chain(self, request: Request) -> Response:
        chain_id = _uuid(request.path_params["chain_id"])
        if chain_id is None:
            return self.ctx.error(request, 404, "No such chain", "That is not a chain id.")
        client = self.ctx.client
        try:
            chain = await client.get_chain(chain_id)
            jobs = await client.list_chain_jobs(chain_id)
        except ChainNotFoundError as exc:
            return self.ctx.error(request, 404, "No such chain", str(exc))
        links = await client.chain_links(chain_id)
        waiting = await client.waiting(chain.id)
        full = request.query_params.get("full")
        return self.ctx.render(
            request,
            "chain.html",
            chain=chain,
            jobs=jobs,
            links=links,
            waiting=waiting,
            input=_format.json_text(chain.input, full=full == "input"),
            output=_format.json_text(chain.output, full=full == "output"),
            error=chain.current_job.last_attempt_error,
        )

    @bounded
    async def job(self, request: Request) -> Response:
        job_id = _uuid(request.path_params["job_id"])
        if job_id is None:
            return self.ctx.error(request, 404, "No such job", "That is not a job id.")
        try:
            job = await self.ctx.client.get_job(job_id)
        except JobNotFoundError as exc:
            return self.ctx.error(request, 404, "No such job", str(exc))
        full = request.query_params.get("full")
        holder = None
        if job.status is JobStatus.RUNNING and job.leased_by:
            workers = await self.ctx.client.list_workers(dead_after=DEAD_AFTER)
            views = {v.worker.id: v for v in worker_views(workers, held_by_worker([job]))}
            holder = views[job.leased_by].state if job.leased_by in views else "dead"
        return self.ctx.render(
            request,
            "job.html",
            job=job,
            holder=holder,
            input=_format.json_text(job.input, full=full == "input"),
            output=_format.json_text(job.output, full=full == "output"),
            history_limit=ATTEMPT_HISTORY_LIMIT,
            traceback_limit=HISTORY_TRACEBACK_LIMIT,
        )

    @bounded
    async def failed(self, request: Request) -> Response:
        filters: dict[str, Any] = {
            "type": _param(request, "type"),
            "queue": _param(request, "queue"),
        }
        try:
            page = await self.ctx.client.list_jobs(
                status=JobStatus.FAILED,
                type_name=filters["type"],
                queue=filters["queue"],
                cursor=_param(request, "cursor"),
                limit=PAGE_SIZE,
            )
        except (DatabaseUnreachableError, DatabaseTimeoutError):
            raise  # answered 503 by the security middleware, not a bad filter
        except PgworkError as exc:
            return self.ctx.error(request, 400, "Bad filter", str(exc))
        return self.ctx.render(request, "failed.html", page=page, filters=filters)

    async def not_found(self, request: Request) -> Response:
        return self.ctx.error(request, 404, "Not found", "No dashboard page has this address.")
