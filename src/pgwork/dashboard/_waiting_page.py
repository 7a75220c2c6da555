"""The waiting page: chains whose current step waits for a signal (with its timeout),
a time, a debounce or blocker chains, and the signals sent that no step has taken.

Two client reads, each a keyset page over the partial indexes the waiting rows and
the pending signals are in (``Client.list_waiting``, ``Client.list_signals``), never
the table. Filters are query parameters: ``kind``, ``type`` (the chain's), ``signal``
(a name prefix, for both lists); ``cursor`` pages the waiting chains, ``signals``
the signals.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from pgwork.dashboard._context import Context, bounded
from pgwork.errors import DatabaseTimeoutError, DatabaseUnreachableError, PgworkError
from pgwork.records import WaitKind

__all__ = ["WaitingPage"]

PAGE_SIZE = 50
SIGNALS_SHOWN = 20


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


class WaitingPage:
    def __init__(self, context: Context) -> None:
        self.ctx = context

    @bounded
    async def waiting(self, request: Request) -> Response:
        filters = {
            "kind": _param(request, "kind"),
            "type": _param(request, "type"),
            "signal": _param(request, "signal"),
        }
        client = self.ctx.client
        try:
            waiting = await client.list_waiting(
                kind=filters["kind"],
                chain_type=filters["type"],
                signal_prefix=filters["signal"],
                cursor=_param(request, "cursor"),
                limit=PAGE_SIZE,
            )
            signals = await client.list_signals(
                name_prefix=filters["signal"],
                cursor=_param(request, "signals"),
                limit=SIGNALS_SHOWN,
            )
        except (DatabaseUnreachableError, DatabaseTimeoutError):
            raise  # answered 503 by the security middleware, not a bad filter
        except PgworkError as exc:
            return self.ctx.error(request, 400, "Bad filter", str(exc))
        return self.ctx.render(
            request,
            "waiting.html",
            waiting=waiting,
            signals=signals,
            filters=filters,
            kinds=[kind.value for kind in WaitKind],
            refresh=True,
        )
