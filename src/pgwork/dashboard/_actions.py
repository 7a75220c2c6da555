"""The operator's actions: retry failed jobs (chosen, or all a filter matches), cancel
or delete a chain, pause or resume a queue, run scheduled jobs now, change or pause a
job type's flow limits (``_limit_forms``).

Each is a POST form checked for its CSRF token, run through the public client API in a
transaction of its own (committed only if the whole action succeeds), and answered with
a redirect back to where the operator was. A refusal by the client (a job that is not
failed, a chain that already ended, a chain others depend on) is shown with the client's
own message, as a 409 page: the same rules and words as in code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import quote
from uuid import UUID

import anyio
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pgwork.client import Client
from pgwork.dashboard._audit import DASHBOARD_ACTION, client_address, emit, who
from pgwork.dashboard._context import NOTICE_COOKIE, Context
from pgwork.dashboard._csrf import CSRF_FIELD, csrf_matches
from pgwork.dashboard._limit_forms import pause_limit, resume_limit, set_limit
from pgwork.errors import (
    ConfigurationError,
    DatabaseTimeoutError,
    DatabaseUnreachableError,
    PgworkError,
)
from pgwork.records import ChainStatus, JobStatus

__all__ = ["Actions"]

# An action must be done within this many seconds (see READ_TIMEOUT in _context).
ACTION_TIMEOUT = 10.0

Action = Callable[[Client, object, FormData], Awaitable[tuple[str, str | None]]]


def _ids(form: FormData, name: str) -> list[UUID]:
    values = [str(v) for v in form.getlist(name)]
    if not values:
        raise ConfigurationError(f"no {name} given: select at least one")
    try:
        return [UUID(v) for v in values]
    except ValueError:
        raise ConfigurationError(f"{name} must be UUIDs, got {values!r}") from None


def _queue(form: FormData) -> str:
    queue = str(form.get("queue", "")).strip()
    if not queue:
        raise ConfigurationError("no queue given")
    return queue


async def _retry(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    retried = await client.retry(tx, _ids(form, "job_id"))
    return f"Retried {len(retried)} job{'s' if len(retried) != 1 else ''}.", None


async def _cancel(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    cancelled = await client.cancel(tx, _ids(form, "chain_id"))
    return f"Cancelled {len(cancelled)} chain{'s' if len(cancelled) != 1 else ''}.", None


async def _delete(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    ids = _ids(form, "chain_id")
    for chain_id in ids:
        chain = await client.get_chain(chain_id, tx=tx)
        if chain.status is ChainStatus.ACTIVE:
            raise ConfigurationError(
                f"chain {chain_id} is still active; cancel it first, then delete it"
            )
    deleted = await client.delete_chains(tx, ids)
    return f"Deleted {deleted} chain{'s' if deleted != 1 else ''}.", "/chains"


async def _pause(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    queue = _queue(form)
    await client.pause_queue(queue, tx=tx)
    return f"Paused queue {queue}.", None


async def _resume(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    queue = _queue(form)
    await client.resume_queue(queue, tx=tx)
    return f"Resumed queue {queue}.", None


async def _trigger(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    ids = _ids(form, "job_id")
    for job_id in ids:
        job = await client.get_job(job_id, tx=tx)
        if job.status is not JobStatus.PENDING:
            raise ConfigurationError(
                f"job {job.id} is {job.status.value}, not scheduled: only a pending job "
                "can be run now"
            )
    await client.trigger(tx, ids)
    return f"Made {len(ids)} job{'s' if len(ids) != 1 else ''} due now.", None


# Failed jobs one "retry all matching" retries at most; the notice says when more match.
RETRY_ALL_AT_MOST = 1000


def _text(form: FormData, name: str) -> str | None:
    """A filter as the listing had it: exact (an error message is matched as stored)."""
    return str(form.get(name, "")) or None


async def _retry_all(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    """Every failed job matching the listing's filters (queue, error), not only the
    rows of the page shown, up to RETRY_ALL_AT_MOST at a time."""
    page = await client.list_work(
        status="failed",
        queue=_text(form, "queue"),
        error_type=_text(form, "error_type"),
        error_message=_text(form, "error_message"),
        limit=RETRY_ALL_AT_MOST,
        tx=tx,
    )
    if not page.items:
        raise ConfigurationError("no failed job matches these filters any more")
    retried = await client.retry(tx, [job.id for job in page.items])
    more = " More match: retry all again." if page.next_cursor else ""
    return f"Retried {len(retried)} job{'s' if len(retried) != 1 else ''}.{more}", None


ACTIONS: dict[str, Action] = {
    "retry": _retry,
    "cancel": _cancel,
    "delete": _delete,
    "pause": _pause,
    "resume": _resume,
    "trigger": _trigger,
    "retry_all": _retry_all,
    "set_limit": set_limit,
    "pause_limit": pause_limit,
    "resume_limit": resume_limit,
}


def _next_path(form: FormData) -> str:
    """Where to go afterwards: a path of the dashboard, never another site."""
    path = str(form.get("next", "/"))
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


class Actions:
    def __init__(self, context: Context) -> None:
        self.ctx = context

    async def act(self, request: Request) -> Response:
        name = request.path_params["action"]
        action = ACTIONS.get(name)
        if action is None:
            return self.ctx.error(request, 404, "Not found", f"There is no action {name!r}.")
        form = await request.form()

        def audit(outcome: str, message: str) -> None:
            ids = tuple(
                str(v)
                for key in ("job_id", "chain_id", "queue", "job_type", "limit_key")
                for v in form.getlist(key)
            )
            emit(
                self.ctx.client_source,
                DASHBOARD_ACTION,
                action=name,
                user=who(request),
                client=client_address(request),
                ids=ids,
                outcome=outcome,
                message=message,
            )

        if self.ctx.read_only:
            audit("forbidden", "read-only dashboard")
            return self.ctx.error(
                request, 403, "Read-only", "This dashboard is read-only: actions are disabled."
            )
        if not csrf_matches(request, form.get(CSRF_FIELD)):
            audit("forbidden", "missing or invalid CSRF token")
            return self.ctx.error(
                request,
                403,
                "Refused",
                "The form's security token is missing or stale. Reload the page and try again.",
            )
        client = self.ctx.client
        try:
            with anyio.fail_after(ACTION_TIMEOUT):
                async with client.state.transaction() as tx:
                    notice, goto = await action(client, tx, form)
        except (DatabaseUnreachableError, DatabaseTimeoutError) as exc:
            audit("refused", f"database unavailable: {exc}")
            raise
        except PgworkError as exc:
            audit("refused", str(exc))
            return self.ctx.error(request, 409, f"Could not {name}", str(exc))
        except TimeoutError:
            audit("unknown", f"the database gave no answer within {ACTION_TIMEOUT:g} s")
            return self.ctx.error(
                request,
                503,
                "Database not answering",
                f"The database gave no answer within {ACTION_TIMEOUT:g} s; the {name} may or "
                "may not have been applied. Reload the page to see.",
            )
        audit("done", notice)
        response = RedirectResponse(
            self.ctx.url(request, goto or _next_path(form)), status_code=303
        )
        # Percent-encoded: a header carries Latin-1 only, and a queue name may not be.
        response.set_cookie(
            NOTICE_COOKIE, quote(notice), path=self.ctx.prefix(request) or "/", samesite="strict"
        )
        return response
