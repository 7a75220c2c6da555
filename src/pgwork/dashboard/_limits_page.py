"""The limits page: each limited job type's running jobs against its limit, its waiting
jobs and its pause, with the keys closest to their limit, and the forms that change
them (``set_limit``, ``pause_limit``, ``resume_limit`` in ``_actions``).

One client read (``Client.limits``): index ranges of the running and waiting limited
jobs, never the table.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from pgwork.dashboard._context import Context, bounded
from pgwork.dashboard._limit_forms import PAUSES

__all__ = ["LimitsPage"]

# Keys shown per keyed type (closest to their limit, then paused or overridden).
KEYS_SHOWN = 10


class LimitsPage:
    def __init__(self, context: Context) -> None:
        self.ctx = context

    @bounded
    async def limits(self, request: Request) -> Response:
        found = await self.ctx.client.limits(keys=KEYS_SHOWN)
        return self.ctx.render(request, "limits.html", limits=found, pauses=PAUSES, refresh=True)
