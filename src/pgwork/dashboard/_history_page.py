"""The history page: throughput, wait time and run time over the last day, week, 30 or
90 days, per queue and job type.

One client read of the job history (``Client.job_history``): a range of its buckets,
never the jobs, so the page costs the same whatever the jobs table holds. The figures
reach as far as the workers' maintenance has counted (``rolled_up_to``), and back past
retention.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from pgwork.dashboard import _history_format as fmt
from pgwork.dashboard._context import Context, bounded

__all__ = ["HistoryPage"]

DEFAULT_WINDOW = "1d"


class HistoryPage:
    def __init__(self, context: Context) -> None:
        self.ctx = context

    @bounded
    async def history(self, request: Request) -> Response:
        chosen = request.query_params.get("window", DEFAULT_WINDOW)
        if chosen not in fmt.WINDOWS:
            chosen = DEFAULT_WINDOW
        window, title = fmt.WINDOWS[chosen]
        filters = {
            "queue": request.query_params.get("queue", "").strip() or None,
            "type": request.query_params.get("type", "").strip() or None,
        }
        history = await self.ctx.client.job_history(
            window=window, queue=filters["queue"], type_name=filters["type"]
        )
        return self.ctx.render(
            request,
            "history.html",
            history=history,
            window=chosen,
            windows=[(key, label) for key, (_, label) in fmt.WINDOWS.items()],
            title=title,
            filters=filters,
            throughput=fmt.throughput(history),
            waits=fmt.durations(history, lambda f: f.wait),
            runs=fmt.durations(history, lambda f: f.run),
            seconds=fmt.seconds,
        )
