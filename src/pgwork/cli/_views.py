"""What the operator commands of ``pgwork`` print: records as JSON and as rich tables.

Pure: no I/O and no clock. The caller passes ``now`` from the database, so an age
("created 5s ago", a worker's last heartbeat) is measured on the clock that wrote the
timestamp, whatever the operator's machine thinks the time is.

The JSON shapes are a contract with scripts: keys are the records' field names, a key
is never renamed or dropped (new ones may appear), timestamps are ISO 8601 with their
offset, durations are seconds, ids are strings. Inputs and outputs are the stored JSON,
as the CLI has no job-type registry to decode them with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pgwork.adapters.state import QueueCount, WorkerRecord
from pgwork.records import Chain, Job, JobStatus, Page, Waiting

__all__ = [
    "Unhandled",
    "age",
    "chain_json",
    "chain_view",
    "dumps",
    "job_json",
    "job_page_json",
    "job_page_view",
    "job_view",
    "queues_json",
    "queues_view",
    "waiting_json",
    "workers_json",
    "workers_view",
]

COLUMN_GAP = 2  # rich's default padding between the columns of a borderless table
MIN_SQUEEZED = 20
MIN_CUT = 8  # narrower than this, a cut type or queue name tells nothing

STATUS_STYLE = {
    "blocked": "magenta",
    "pending": "",
    "running": "cyan",
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
    "active": "cyan",
}


# --- JSON ----------------------------------------------------------------------------


def dumps(data: Any) -> str:
    """One JSON document; anything the records hold that JSON lacks becomes a string."""
    return json.dumps(data, default=str, ensure_ascii=False)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _seconds(value: timedelta | None) -> float | None:
    return value.total_seconds() if value is not None else None


def job_json(job: Job[Any]) -> dict[str, Any]:
    error = job.last_attempt_error
    return {
        "id": str(job.id),
        "type_name": job.type_name,
        "status": job.status.value,
        "queue": job.queue,
        "priority": job.priority,
        "chain_id": str(job.chain_id),
        "chain_type_name": job.chain_type_name,
        "chain_index": job.chain_index,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "input": job.input,
        "output": job.output,
        "last_attempt_error": error.to_json() if error is not None else None,
        "created_at": _iso(job.created_at),
        "scheduled_at": _iso(job.scheduled_at),
        "started_at": _iso(job.started_at),
        "completed_at": _iso(job.completed_at),
        "last_attempt_at": _iso(job.last_attempt_at),
        "leased_by": job.leased_by,
        "leased_until": _iso(job.leased_until),
        "dedup_key": job.dedup_key,
        "context": job.context,
        "limit_key": job.limit_key,
        "debounce_deadline": _iso(job.debounce_deadline),
        "attempt_history": [
            {
                "attempt": a.attempt,
                "at": _iso(a.at),
                "worker": a.worker,
                "ran_for_seconds": _seconds(a.ran_for),
                "error": a.error.to_json(),
            }
            for a in job.attempt_history
        ],
    }


def job_page_json(page: Page[Job[Any]]) -> dict[str, Any]:
    return {"jobs": [job_json(job) for job in page.items], "next_cursor": page.next_cursor}


def waiting_json(waiting: Waiting) -> dict[str, Any]:
    """What a step waits for: ``Waiting``'s fields, and ``description`` in words."""
    return {
        "kind": waiting.kind.value,
        "chain_id": str(waiting.chain_id),
        "chain_type_name": waiting.chain_type_name,
        "job_id": str(waiting.job_id),
        "type_name": waiting.type_name,
        "chain_index": waiting.chain_index,
        "queue": waiting.queue,
        "since": _iso(waiting.since),
        "until": _iso(waiting.until),
        "signal": waiting.signal,
        "deadline": _iso(waiting.deadline),
        "done": waiting.done,
        "total": waiting.total,
        "description": waiting.describe(),
    }


def chain_json(
    chain: Chain, jobs: Sequence[Job[Any]], waiting: Waiting | None = None
) -> dict[str, Any]:
    """``waiting``: what its current step waits for (``null``: nothing a worker does
    not do)."""
    return {
        "id": str(chain.id),
        "type_name": chain.type_name,
        "status": chain.status.value,
        "input": chain.input,
        "output": chain.output,
        "created_at": _iso(chain.created_at),
        "completed_at": _iso(chain.completed_at),
        "dedup_key": chain.dedup_key,
        "waiting": waiting_json(waiting) if waiting is not None else None,
        "jobs": [job_json(job) for job in jobs],
    }


@dataclass(frozen=True, slots=True)
class Unhandled:
    """Ready work that no live worker will take: a queue no live worker takes jobs from
    (``job_type`` None), or a job type that none of the live workers taking from its
    queue handles."""

    queue: str
    job_type: str | None
    ready: int | None = None

    def describe(self) -> str:
        if self.job_type is None:
            return (
                f"queue {self.queue!r}: {self.ready} ready, but no live worker takes jobs from it"
            )
        return (
            f"queue {self.queue!r}: job type {self.job_type!r} is pending, but no live "
            "worker taking from this queue handles it"
        )


def queues_json(
    counts: Sequence[QueueCount], unhandled: Sequence[Unhandled] = ()
) -> dict[str, Any]:
    return {
        "queues": [
            {
                "queue": count.queue,
                "paused": count.paused,
                "depth": count.depth,
                "ready": count.ready,
                "scheduled": count.scheduled,
                "leased": count.running,
                "blocked": count.blocked,
                "failed": count.failed,
                "oldest_ready_at": _iso(count.oldest_ready_at),
                "oldest_ready_age_seconds": _seconds(count.oldest_ready_age),
            }
            for count in counts
        ],
        "unhandled": [
            {"queue": item.queue, "job_type": item.job_type, "message": item.describe()}
            for item in unhandled
        ],
    }


def workers_json(workers: Sequence[WorkerRecord], now: datetime) -> dict[str, Any]:
    return {
        "workers": [
            {
                "id": worker.id,
                "host": worker.host,
                "pid": worker.pid,
                "status": worker.status,
                "alive": worker.alive,
                "active_slots": worker.active_slots,
                "max_slots": worker.max_slots,
                "abandoned_handlers": worker.abandoned_handlers,
                "queues": list(worker.queues),
                "job_types": list(worker.job_types),
                "started_at": _iso(worker.started_at),
                "heartbeat_at": _iso(worker.heartbeat_at),
                "heartbeat_age_seconds": _seconds(now - worker.heartbeat_at),
                "metadata": dict(worker.metadata),
            }
            for worker in workers
        ]
    }


# --- rich ----------------------------------------------------------------------------


def age(value: timedelta | None) -> str:
    """A short human duration: 0s, 42s, 3m 12s, 2h 05m, 4d 03h."""
    if value is None:
        return "-"
    total = max(int(value.total_seconds()), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


def _ago(value: datetime | None, now: datetime) -> str:
    return f"{age(now - value)} ago" if value is not None else "-"


def _status(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def _error_line(job: Job[Any]) -> Text:
    error = job.last_attempt_error
    if error is None:
        return Text("")
    line = f"{error.type}: {' '.join(error.message.split())}"
    return Text(line, style="red", no_wrap=True, overflow="ellipsis")


def _table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Text]],
    *,
    width: int,
    right: Sequence[str] = (),
    squeeze_last: bool = False,
) -> Table:
    """A borderless table. With ``squeeze_last`` the last column (an error message) is
    cut to fit, and left out when fewer than MIN_SQUEEZED cells of it would fit beside
    the others: rich would otherwise shrink every column to a few letters, and a
    terminal may be only 80 columns wide. ``jobs show`` and --json always carry the
    whole message."""
    keep = len(columns)
    if squeeze_last:
        fixed = [
            max([cell_len(name)] + [row[i].cell_len for row in rows])
            for i, name in enumerate(columns[:-1])
        ]
        if width - sum(fixed) - COLUMN_GAP * len(fixed) < MIN_SQUEEZED:
            keep -= 1
    table = Table(header_style="bold", box=None, pad_edge=False)
    wrapping = len(columns) - 1 if squeeze_last and keep == len(columns) else None
    limits = _narrowed(columns[:keep], rows, width, wrapping)
    for i, name in enumerate(columns[:keep]):
        # Only a column rich may wrap is narrowed before all the others; its cells are
        # Text(no_wrap=True, overflow="ellipsis"), so narrowing cuts them to one line.
        table.add_column(
            name,
            no_wrap=i != wrapping,
            justify="right" if name in right else "left",
            max_width=limits[i],
        )
    for row in rows:
        table.add_row(*row[:keep])
    return table


def _narrowed(
    columns: Sequence[str], rows: Sequence[Sequence[Text]], width: int, wrapping: int | None
) -> list[int | None]:
    """The widths to cut columns to so that a row fits in ``width``: the widest column
    first, a letter at a time, never an ``ID`` (what an operator copies into the next
    command) nor below MIN_CUT. Left to itself, rich shrinks every column alike, the
    ids included. The wrapping column (an error message) is rich's to narrow."""
    natural = [
        max([cell_len(name)] + [row[i].cell_len for row in rows]) for i, name in enumerate(columns)
    ]
    widths = list(natural)
    budget = width - COLUMN_GAP * (len(columns) - 1)
    if wrapping is not None:
        budget -= MIN_SQUEEZED
    cuttable = [i for i, name in enumerate(columns) if name != "ID" and i != wrapping]
    fixed = [i for i in range(len(columns)) if i != wrapping]
    while sum(widths[i] for i in fixed) > budget:
        widest = max(cuttable, key=lambda i: widths[i], default=None)
        if widest is None or widths[widest] <= MIN_CUT:
            break
        widths[widest] -= 1
    return [w if w < n else None for w, n in zip(widths, natural, strict=True)]


def job_page_view(page: Page[Job[Any]], now: datetime, *, width: int) -> RenderableType:
    if not page.items:
        return Text("no jobs match", style="dim")
    rows = [
        [
            Text(str(job.id)),
            _status(job.status.value),
            Text(job.type_name),
            Text(job.queue),
            Text(f"{job.attempt}/{job.max_attempts}"),
            Text(age(now - job.created_at)),
            _error_line(job),
        ]
        for job in page.items
    ]
    columns = ("ID", "STATUS", "TYPE", "QUEUE", "TRIES", "AGE", "LAST ERROR")
    table = _table(columns, rows, width=width, right=("TRIES",), squeeze_last=True)
    if page.next_cursor is None:
        return table
    more = Text.assemble(("next page: ", "dim"), f"--cursor {page.next_cursor}")
    return Group(table, more)


def _fields(rows: Sequence[tuple[str, str | Text]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for name, value in rows:
        grid.add_row(name, value if isinstance(value, Text) else Text(value))
    return grid


def _json_text(value: Any) -> Text:
    return Text(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def _when(value: datetime | None, now: datetime) -> str:
    return f"{value.isoformat()} ({_ago(value, now)})" if value is not None else "-"


def _due(at: datetime, now: datetime) -> str:
    """``at`` and how far it is from now: "in 3m 12s" ahead, "42s ago" behind."""
    return f"{at.isoformat()} ({'in ' + age(at - now) if at > now else _ago(at, now)})"


def _debounced(job: Job[Any] | None, now: datetime) -> list[tuple[str, str | Text]]:
    """The row a debounced chain's first job adds to a view: while a later enqueue of
    its key may still merge into it (pending, never started), when it starts next and
    the deadline no merge pushes it past; once it has started, the deadline it had.
    No row for any other job."""
    deadline = job.debounce_deadline if job is not None else None
    if job is None or deadline is None:
        return []
    if job.debouncing:
        line = f"next start {_due(job.scheduled_at, now)}, deadline {_due(deadline, now)}"
    else:
        line = f"no longer (started or ended); its deadline was {deadline.isoformat()}"
    return [("debounced", line)]


def job_view(job: Job[Any], now: datetime) -> RenderableType:
    scheduled = job.scheduled_at
    due = "in " + age(scheduled - now) if scheduled > now else _ago(scheduled, now)
    lease = "-"
    if job.leased_by is not None:
        lease = f"{job.leased_by} until {_iso(job.leased_until)}"
    rows: list[tuple[str, str | Text]] = [
        ("id", str(job.id)),
        ("type", job.type_name),
        ("status", _status(job.status.value)),
        ("queue", f"{job.queue} (priority {job.priority})"),
        ("chain", f"{job.chain_id} ({job.chain_type_name}, step {job.chain_index})"),
        ("attempt", f"{job.attempt} of {job.max_attempts}"),
        ("created", _when(job.created_at, now)),
        ("scheduled", f"{scheduled.isoformat()} ({due})"),
        ("started", _when(job.started_at, now)),
        (_ended(job.status.value, job.status.is_final), _when(job.completed_at, now)),
        ("last attempt", _when(job.last_attempt_at, now)),
        ("lease", lease),
        ("dedup key", job.dedup_key or "-"),
        *_debounced(job, now),
        ("limit key", job.limit_key or "-"),
        ("context", _json_text(job.context) if job.context else "-"),
        ("input", _json_text(job.input)),
    ]
    if job.status is JobStatus.COMPLETED or job.output is not None:
        rows.append(("output", _json_text(job.output)))
    if job.attempt_history:
        rows.append(("failures", _attempts_text(job, now)))
    error = job.last_attempt_error
    if error is None:
        return _fields(rows)
    rows.append(("last error", Text(f"{error.type}: {error.message}", style="red")))
    if not error.traceback:
        return _fields(rows)
    return Group(_fields(rows), Text("traceback:", style="bold"), Text(error.traceback.rstrip()))


def _attempts_text(job: Job[Any], now: datetime) -> Text:
    """One line per failed attempt, oldest first: number, when, worker, run time, and
    the error's type and first line."""
    text = Text()
    for a in job.attempt_history:
        ran = f", ran {age(a.ran_for)}" if a.ran_for is not None else ""
        first_line = a.error.message.splitlines()[0] if a.error.message else ""
        text.append(f"#{a.attempt} {_when(a.at, now)} on {a.worker or '-'}{ran}: ")
        text.append(f"{a.error.type}: {first_line}\n", style="red")
    text.rstrip()
    return text


def _ended(status: str, final: bool) -> str:
    """The label of a job's or chain's end time: what it ended as (``failed`` at ...),
    not always ``completed``; ``ended`` while it has not."""
    return status if final else "ended"


def _waits(waiting: Waiting | None, now: datetime) -> list[tuple[str, str | Text]]:
    """The row a chain whose current step waits adds to its view: what for, and which
    step since when. No row for a chain whose step waits for nothing."""
    if waiting is None:
        return []
    step = f"step {waiting.chain_index} ({waiting.type_name}) since {_ago(waiting.since, now)}"
    return [("waiting", Text(f"for {waiting.describe()}; {step}", style="magenta"))]


def chain_view(
    chain: Chain,
    jobs: Sequence[Job[Any]],
    now: datetime,
    *,
    width: int,
    waiting: Waiting | None = None,
) -> RenderableType:
    rows: list[tuple[str, str | Text]] = [
        ("chain", str(chain.id)),
        ("type", chain.type_name),
        ("status", _status(chain.status.value)),
        *_waits(waiting, now),
        ("created", _when(chain.created_at, now)),
        (_ended(chain.status.value, chain.status != "active"), _when(chain.completed_at, now)),
        ("dedup key", chain.dedup_key or "-"),
        *_debounced(next((job for job in jobs if job.is_chain_root), None), now),
        ("input", _json_text(chain.input)),
        ("output", _json_text(chain.output) if chain.output is not None else "-"),
    ]
    steps = [
        [
            Text(str(job.chain_index)),
            Text(str(job.id)),
            _status(job.status.value),
            Text(job.type_name),
            Text(f"{job.attempt}/{job.max_attempts}"),
            _error_line(job),
        ]
        for job in jobs
    ]
    columns = ("STEP", "ID", "STATUS", "TYPE", "TRIES", "LAST ERROR")
    table = _table(columns, steps, width=width, right=("STEP", "TRIES"), squeeze_last=True)
    return Group(_fields(rows), Text(""), table)


def queues_view(
    counts: Sequence[QueueCount],
    *,
    width: int,
    in_handlers: int | None = None,
    unhandled: Sequence[Unhandled] = (),
) -> RenderableType:
    """``in_handlers``: handlers the live workers report running; the rest of the leased
    jobs are reserved (prefetched, waiting for a slot). The store cannot tell the two
    apart per queue: a prefetched job is leased like a running one. ``unhandled``: ready
    work no live worker will take, one warning line each."""
    if not counts:
        # Finished jobs are not counted: an empty list also follows work all done.
        return Text(
            "every queue is empty: no job is pending, scheduled, running, blocked or "
            "failed, and no queue is paused",
            style="dim",
        )
    rows = [
        [
            Text(count.queue),
            Text(str(count.depth)),
            Text(str(count.ready)),
            Text(str(count.scheduled)),
            Text(str(count.running)),
            Text(str(count.blocked)),
            Text(str(count.failed), style="red" if count.failed else ""),
            Text(age(count.oldest_ready_age)),
            Text("yes", style="yellow") if count.paused else Text("no", style="dim"),
        ]
        for count in counts
    ]
    numbers = ("DEPTH", "READY", "SCHEDULED", "LEASED", "BLOCKED", "FAILED", "OLDEST READY")
    table = _table(("QUEUE", *numbers, "PAUSED"), rows, width=width, right=numbers)
    lines: list[RenderableType] = [table]
    leased = sum(count.running for count in counts)
    if leased and in_handlers is not None:
        running = min(in_handlers, leased)
        note = (
            f"leased {leased}: {running} running in handlers, {leased - running} reserved "
            "(prefetched by a worker, waiting for a slot), as the live workers report"
        )
        lines.append(Text(note, style="dim"))
    lines.extend(Text(f"warning: {item.describe()}", style="yellow") for item in unhandled)
    return Group(*lines) if len(lines) > 1 else table


def _alive(worker: WorkerRecord) -> Text:
    """yes; ``stopped`` for a worker that said it stopped (or whose jobs another worker
    took back after declaring it dead): nothing is left to do about it; ``no (dead)`` for
    one whose heartbeat stopped without either, whose leased jobs wait to be reaped."""
    if worker.alive:
        return Text("yes", style="green")
    if worker.status == "stopped":
        return Text("stopped", style="dim")
    return Text("no (dead)", style="red")


def workers_view(workers: Sequence[WorkerRecord], now: datetime, *, width: int) -> RenderableType:
    if not workers:
        return Text("no workers registered", style="dim")
    rows = [
        [
            Text(worker.id),
            Text(worker.host),
            Text(str(worker.pid)),
            Text(worker.status),
            Text(f"{worker.active_slots}/{worker.max_slots}"),
            Text(
                str(worker.abandoned_handlers),
                style="red" if worker.abandoned_handlers else "dim",
            ),
            Text(",".join(worker.queues) or "-"),
            Text(_ago(worker.heartbeat_at, now)),
            _alive(worker),
        ]
        for worker in workers
    ]
    columns = ("ID", "HOST", "PID", "STATUS", "SLOTS", "HUNG", "QUEUES", "HEARTBEAT", "ALIVE")
    return _table(columns, rows, width=width, right=("PID", "SLOTS", "HUNG"))
