"""``manage.py pgwork_worker``: run the project's tasks until SIGTERM or Ctrl-C."""

from __future__ import annotations

from typing import Any

import anyio
from django.core.management.base import BaseCommand, CommandParser

from pgwork.cli._common import stop_on_signals
from pgwork.contrib.django._compat import DEFAULT_TASK_BACKEND_ALIAS
from pgwork.contrib.django._worker import build_worker


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Run a pgwork worker for the tasks of a pgwork task backend (the @task functions "
        "in the `tasks` modules of the installed apps) until SIGTERM or Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            default=DEFAULT_TASK_BACKEND_ALIAS,
            help="The TASKS alias of the pgwork backend (default: %(default)s).",
        )
        parser.add_argument("--slots", type=int, default=10, help="Tasks run at once.")
        parser.add_argument(
            "--queues",
            nargs="+",
            help="Queues to take tasks from, in priority order (default: the backend's QUEUES).",
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            default=2.0,
            help="Longest wait in seconds without a notification.",
        )

    def handle(
        self,
        *args: Any,
        backend: str,
        slots: int,
        queues: list[str] | None,
        poll_interval: float,
        **options: Any,
    ) -> None:
        async def serve() -> None:
            worker = await build_worker(
                backend, max_slots=slots, queues=queues, poll_interval=poll_interval
            )
            try:
                async with anyio.create_task_group() as tasks:
                    # First signal: graceful stop; a second aborts in-flight tasks.
                    await tasks.start(stop_on_signals, worker.stop, tasks)
                    await worker.run()
                    tasks.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await worker.client.close()

        anyio.run(serve)
