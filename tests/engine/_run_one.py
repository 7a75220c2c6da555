"""One job run to a status on a worker of its own: the setup the handler tests share.

``run_one(registry, input, until=..., processors={job_type: handler})`` (or
``process_handlers=``, with any other option of ``create_in_process_worker``) builds a
client on the test's database, starts a worker with the options, enqueues one job of
the one type the handlers name, commits it, and waits until the job's status is
``until`` (or one of them), or, ``until`` a function, until it returns true (a handler
that says it runs). The test then looks at what happened, or goes on from there:
``ran.job()``, ``ran.client``, ``ran.worker``, ``ran.started``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from pgwork import Client, InProcessWorker, Job, JobStatus, JobTypeRegistry, StartedChain

from .conftest import ClientFactory, eventually

__all__ = ["Ran", "RunOne"]


@dataclass(frozen=True)
class Ran:
    """The worker and the client ``run_one`` made, and the chain it started."""

    client: Client
    worker: InProcessWorker
    started: StartedChain[Any, Any]

    async def job(self) -> Job[Any]:
        """The job as it is now."""
        return await self.client.get_job(self.started.job_id)


class RunOne:
    """``run_one``: see the module."""

    def __init__(
        self,
        make_client: ClientFactory,
        workers: Callable[..., Awaitable[InProcessWorker]],
        conn: psycopg.AsyncConnection[Any],
    ) -> None:
        self._make_client = make_client
        self._workers = workers
        self._conn = conn

    async def __call__(
        self,
        registry: JobTypeRegistry,
        input: Any,
        *,
        until: JobStatus | tuple[JobStatus, ...] | Callable[[], bool],
        what: str | None = None,
        **options: Any,
    ) -> Ran:
        client = await self._make_client(registry)
        worker = await self._workers(client=client, **options)
        [job_type] = [*options.get("processors", ()), *options.get("process_handlers", ())]
        started = await client.start_chain(self._conn, job_type, input)
        await self._conn.commit()
        ran = Ran(client, worker, started)
        if callable(until):
            check = until

            async def reached() -> bool:
                return check()

            shown = "the condition"
        else:
            statuses = until if isinstance(until, tuple) else (until,)

            async def reached() -> bool:
                return (await ran.job()).status in statuses

            shown = "the job " + " or ".join(status.value for status in statuses)
        await eventually(reached, what=what or shown, timeout=30)
        return ran
